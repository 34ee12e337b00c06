"""A harness release in a coding agent's own form, and the config that binds the agent to this reef_lab.

Each agent reads its harness from a config folder of its own, which the install root holds per agent
(`<root>/<adapter>`, root `~/reef-harness/<scenario>` by default) and which the agent is pointed at by one
environment variable:

| adapter | folder variable | instructions | skills | commands | binding |
|---|---|---|---|---|---|
| claude | CLAUDE_CONFIG_DIR | CLAUDE.md | skills/<name>/SKILL.md | commands/<name>.md | settings.json `env` |
| codex | CODEX_HOME | AGENTS.md | skills/<name>/SKILL.md | prompts/<name>.md | config.toml provider table |
| opencode | OPENCODE_CONFIG_DIR | AGENTS.md | skill/<name>/SKILL.md | command/<name>.md | opencode.json provider |
| pi | PI_CODING_AGENT_DIR | AGENTS.md | skills/<name>/SKILL.md | prompts/<name>.md | models.json + settings.json |
| files | - | the tree as it is | | | none |

The instructions file holds `system_prompt.md` and then `rules.md` under a "Rules" heading; every skill gets
`name`/`description` front matter (from its own front matter, else its file name and first line); the harness's
other files go under `files/`. The binding sends the base URL, `x-reef-scenario`, `x-reef-harness` (the installed
release: serving then does not apply the harness a second time) and, where the agent reads a header from the
environment, the session (`x-reef-session` and the `x-reef-tag-session` tag from `REEF_SESSION`); the key comes
from `REEF_AGENT_KEY` (the wrapper sets it to `REEF_TOKEN`). No secret is written to a file.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from reef_lab import harness as harness_mod
from reef_lab.errors import BadRequest, Conflict

ADAPTERS = ("claude", "codex", "opencode", "pi", "files")
RELEASE_FILE = ".reef-release"  # in the agent's folder: the release id and the sha256 of every written file
KEY_ENV, SESSION_ENV = "REEF_AGENT_KEY", "REEF_SESSION"
FOLDER_ENV = {"claude": "CLAUDE_CONFIG_DIR", "codex": "CODEX_HOME", "opencode": "OPENCODE_CONFIG_DIR",
              "pi": "PI_CODING_AGENT_DIR"}
_PLACES = {  # adapter -> (instructions file, skills folder, commands folder)
    "claude": ("CLAUDE.md", "skills", "commands"), "codex": ("AGENTS.md", "skills", "prompts"),
    "opencode": ("AGENTS.md", "skill", "command"), "pi": ("AGENTS.md", "skills", "prompts")}
_URL = re.compile(r"^https?://[A-Za-z0-9.\-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$|"
                  r"^https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$")
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")
MAX_DESCRIPTION = 1024  # Claude Code's and the Agent Skills standard's limit


@dataclass(frozen=True)
class Binding:
    """Where the agent sends its calls and what it names there."""

    base_url: str
    scenario: str
    release_id: str
    model: str

    def __post_init__(self) -> None:
        if not _URL.match(self.base_url):
            raise BadRequest(f"base_url {self.base_url[:100]!r} must be http(s)://host[:port][/path] with no query, "
                             "quotes or spaces")
        if not _MODEL.match(self.model):
            raise BadRequest(f"model {self.model[:100]!r} must be 1-200 letters, digits and ._:/@+-")

    def headers(self) -> dict[str, str]:
        return {"x-reef-scenario": self.scenario, harness_mod.INSTALLED_HEADER: self.release_id}


@dataclass
class Rendered:
    files: dict[str, str]  # the harness in the agent's form: the wrapper refuses to run when one differs
    config: dict[str, str]  # the agent's binding to reef_lab (the agent may rewrite it; install restores it)
    release_text: str  # the release file

    def all(self) -> dict[str, str]:
        return {**self.files, **self.config, RELEASE_FILE: self.release_text}


def slug(name: str) -> str:
    """A skill or command name as the agents accept it: lower-case letters, digits and '-', at most 64."""
    s = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:64].strip("-")
    return s or "unnamed"


def _one_line(text: str, limit: int = MAX_DESCRIPTION) -> str:
    return " ".join(str(text).split())[:limit]


def _described(kind: str, path: str, meta: dict, body: str, with_name: bool) -> tuple[str, str]:
    """(name, file text with front matter) of a skill or command of the harness (its front matter parsed)."""
    name = slug(str(meta.get("name") or PurePosixPath(path).stem))
    first = next((line.strip("# ").strip() for line in body.splitlines() if line.strip()), "")
    desc = _one_line(meta.get("description") or first or f"the {name} {kind}")
    head = (f"name: {name}\n" if with_name else "") + f"description: {json.dumps(desc, ensure_ascii=False)}\n"
    return name, f"---\n{head}---\n\n{body.strip()}\n"


def instructions(files: dict[str, str], release_id: str) -> str:
    parts = [f"<!-- reef_lab harness release {release_id}: installed by reef_lab; the next update rewrites it -->"]
    if files.get(harness_mod.SYSTEM_PROMPT, "").strip():
        parts.append(files[harness_mod.SYSTEM_PROMPT].strip())
    if files.get(harness_mod.RULES, "").strip():
        parts.append("## Rules\n\n" + files[harness_mod.RULES].strip())
    return "\n\n".join(parts) + "\n"


def agent_files(adapter: str, tree: harness_mod.Harness, release_id: str) -> dict[str, str]:
    """The harness tree in the agent's own form (paths relative to the agent's folder)."""
    files = tree.files
    if adapter == "files":
        return dict(files)
    doc, skills_dir, commands_dir = _PLACES[adapter]
    out = {doc: instructions(files, release_id)}
    seen: dict[str, str] = {}
    for path in sorted(files):
        text = files[path]
        if path in (harness_mod.SYSTEM_PROMPT, harness_mod.RULES):
            continue
        if path.startswith(harness_mod.SKILLS) and path.endswith(".md"):
            name, rendered = _described("skill", path, *tree.fronts[path], with_name=True)
            target = f"{skills_dir}/{name}/SKILL.md"
        elif path.startswith(harness_mod.COMMANDS) and path.endswith(".md"):
            name, rendered = _described("command", path, *tree.fronts[path], with_name=False)
            target = f"{commands_dir}/{name}.md"
        else:
            target, rendered = f"files/{path}", text
        if target in seen:
            raise Conflict(f"harness files {seen[target]!r} and {path!r} both become {adapter}'s {target!r}; rename "
                           "one (skill and command names are lower-case letters, digits and '-')")
        seen[target] = path
        out[target] = rendered
    return out


def _toml_inline(table: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in table.items()) + " }"


def agent_config(adapter: str, b: Binding) -> dict[str, str]:
    """The files that bind the agent to this reef_lab (paths relative to the agent's folder)."""
    v1 = b.base_url.rstrip("/") + "/v1"
    session = {"x-reef-session": SESSION_ENV, "x-reef-tag-session": SESSION_ENV}
    if adapter == "claude":  # the wrapper adds the session header per run (--settings) and passes --session-id
        headers = "\n".join(f"{k}: {v}" for k, v in b.headers().items())
        return {"settings.json": json.dumps({"env": {"ANTHROPIC_BASE_URL": b.base_url.rstrip("/"),
                                                     "ANTHROPIC_CUSTOM_HEADERS": headers}}, indent=2) + "\n"}
    if adapter == "codex":
        return {"config.toml": (
            f"# reef_lab: Codex bound to {b.base_url} (scenario {b.scenario}, harness {b.release_id}); "
            "install rewrites this file\n"
            f"model = {json.dumps(b.model)}\nmodel_provider = \"reef\"\n\n[model_providers.reef]\n"
            f"name = \"reef_lab\"\nbase_url = {json.dumps(v1)}\nwire_api = \"responses\"\n"
            f"env_key = \"{KEY_ENV}\"\nhttp_headers = {_toml_inline(b.headers())}\n"
            f"env_http_headers = {_toml_inline(session)}\n")}
    if adapter == "opencode":
        env_headers = {k: "{env:" + v + "}" for k, v in session.items()}
        config = {"$schema": "https://opencode.ai/config.json", "model": f"reef/{b.model}", "autoupdate": False,
                  "provider": {"reef": {"npm": "@ai-sdk/openai-compatible", "name": "reef_lab",
                                        "options": {"baseURL": v1, "apiKey": "{env:" + KEY_ENV + "}",
                                                    "headers": {**b.headers(), **env_headers}},
                                        "models": {b.model: {"name": b.model, "tool_call": True}}}}}
        return {"opencode.json": json.dumps(config, indent=2) + "\n"}
    if adapter == "pi":  # pi reads a header value that names an environment variable from that variable
        models = {"providers": {"reef": {"baseUrl": v1, "api": "openai-completions", "apiKey": KEY_ENV,
                                         "headers": {**b.headers(), **session}, "models": [{"id": b.model}]}}}
        return {"models.json": json.dumps(models, indent=2) + "\n",
                "settings.json": json.dumps({"defaultProvider": "reef", "defaultModel": b.model}, indent=2) + "\n"}
    return {}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def release_text(adapter: str, b: Binding, files: dict[str, str], config: dict[str, str]) -> str:
    """The release file: one `key value` per line; `file`/`config` lines are `<sha256> <path>` (paths hold no line
    breaks: harness.check_path refuses them)."""
    lines = ["# reef_lab harness install: `reef-lab agent " + adapter + "` checks the files below before each run",
             "format 1", f"release {b.release_id}", f"scenario {b.scenario}", f"adapter {adapter}",
             f"url {b.base_url.rstrip('/')}", f"model {b.model}"]
    lines += [f"file {sha256(t)} {p}" for p, t in sorted(files.items())]
    lines += [f"config {sha256(t)} {p}" for p, t in sorted(config.items())]
    return "\n".join(lines) + "\n"


def render(adapter: str, tree: harness_mod.Harness, binding: Binding) -> Rendered:
    """The agent's files, its binding and the release file, from a parsed harness (reef_lab.harness.load)."""
    if adapter not in ADAPTERS:
        raise BadRequest(f"adapter {adapter!r} is not one of {list(ADAPTERS)}")
    out = agent_files(adapter, tree, binding.release_id)
    config = agent_config(adapter, binding)
    for path in [*out, *config]:
        harness_mod.check_path(path)
    clash = sorted(set(out) & set(config) | {p for p in out if p == RELEASE_FILE})
    if clash:
        raise Conflict(f"harness file {clash[0]!r} would overwrite {adapter}'s own config or release file; rename it")
    return Rendered(out, config, release_text(adapter, binding, out, config))


def parse_release(text: str) -> dict:
    """The release file read back: {release, scenario, adapter, url, model, files: {path: sha}, config: {...}}."""
    out: dict = {"files": {}, "config": {}}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, rest = line.partition(" ")
        if key in ("file", "config"):
            digest, _, path = rest.partition(" ")
            out["files" if key == "file" else "config"][path] = digest
        else:
            out[key] = rest
    for key in ("release", "scenario", "adapter", "url"):
        if key not in out:
            raise ValueError(f"the release file has no {key!r} line")
    return out
