"""Run real agent clients headless against a base URL, and reef_lab's real entry point in front of a provider.

The clients are the pinned npm packages `bash scripts/setup.sh --agents` installs into .agents/node_modules:
Claude Code (Anthropic messages), Codex CLI (OpenAI Responses) and opencode (OpenAI chat). Each run gets its own
home, config folder and working folder under `work`, is started in a process group of its own and killed with it
(SIGKILL to the group) however the run ends, so no agent outlives its test. `ReefServer` runs `scripts/serve.py`
the same way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from reef_lab.testing import ROOT, free_port, serve_script

BIN = ROOT / ".agents" / "node_modules" / ".bin"
AGENTS = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "opencode": "opencode-ai",
          "pi": "@mariozechner/pi-coding-agent"}


def installed(agent: str) -> bool:
    return (BIN / agent).exists()


def version(agent: str) -> str:
    pkg = ROOT / ".agents" / "node_modules" / AGENTS[agent] / "package.json"
    return json.loads(pkg.read_text())["version"]


@dataclass
class AgentRun:
    agent: str
    returncode: int | None
    seconds: float
    stdout: str
    stderr: str
    command: list[str]


def run_group(cmd: list[str], env: dict, cwd: Path, timeout: float) -> tuple[int | None, str, str, float]:
    """Run `cmd` in a new process group; the whole group gets SIGKILL when it ends or times out."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = b"", b"(timed out)"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), time.perf_counter() - t0


def _env(home: Path, **extra) -> dict:
    home.mkdir(parents=True, exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM", "TZ")}
    return {**keep, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".data"),
            "XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".state"), **extra}


def run_claude(base_url: str, prompt: str, work: Path, scenario: str, timeout: float = 300) -> AgentRun:
    cwd, home = work / "cwd", work / "home"
    cwd.mkdir(parents=True, exist_ok=True)
    env = _env(home, ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY="any",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1",
               CLAUDE_CONFIG_DIR=str(home / ".claude"), ANTHROPIC_CUSTOM_HEADERS=f"x-reef-scenario: {scenario}")
    cmd = [str(BIN / "claude"), "-p", prompt, "--output-format", "json", "--permission-mode", "acceptEdits"]
    rc, out, err, secs = run_group(cmd, env, cwd, timeout)
    return AgentRun("claude", rc, secs, out, err, cmd)


def run_codex(base_url: str, prompt: str, work: Path, scenario: str, timeout: float = 300,
              settings: str = "") -> AgentRun:
    """`settings`: top-level config.toml lines to add (e.g. `model_catalog_json = "..."`)."""
    cwd, home = work / "cwd", work / "home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "scripted-model"\nmodel_provider = "reef"\n{settings}\n[model_providers.reef]\nname = "reef"\n'
        f'base_url = "{base_url}/v1"\nwire_api = "responses"\nenv_key = "REEF_AGENT_KEY"\n'
        f'http_headers = {{ "x-reef-scenario" = "{scenario}" }}\n')
    env = _env(home, CODEX_HOME=str(codex_home), REEF_AGENT_KEY="any")
    # The tests run in a throwaway folder; Codex's own sandbox needs a helper it cannot install under /tmp.
    cmd = [str(BIN / "codex"), "exec", "--json", "--skip-git-repo-check",
           "--dangerously-bypass-approvals-and-sandbox", prompt]
    rc, out, err, secs = run_group(cmd, env, cwd, timeout)
    return AgentRun("codex", rc, secs, out, err, cmd)


def run_opencode(base_url: str, prompt: str, work: Path, scenario: str, timeout: float = 300) -> AgentRun:
    cwd, home = work / "cwd", work / "home"
    cwd.mkdir(parents=True, exist_ok=True)
    config = {"$schema": "https://opencode.ai/config.json", "model": "reef/scripted-model",
              "permission": {"edit": "allow", "bash": "allow"}, "autoupdate": False, "share": "disabled",
              "provider": {"reef": {"npm": "@ai-sdk/openai-compatible", "name": "reef",
                                    "options": {"baseURL": f"{base_url}/v1", "apiKey": "any",
                                                "headers": {"x-reef-scenario": scenario}},
                                    "models": {"scripted-model": {"name": "scripted-model", "tool_call": True}}}}}
    (cwd / "opencode.json").write_text(json.dumps(config))
    env = _env(home, OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_MODELS_FETCH="1")
    cmd = [str(BIN / "opencode"), "run", "--format", "json", prompt]
    rc, out, err, secs = run_group(cmd, env, cwd, timeout)
    return AgentRun("opencode", rc, secs, out, err, cmd)


RUNNERS = {"claude": run_claude, "codex": run_codex, "opencode": run_opencode}

# Each agent's headless arguments, for `reef-lab agent <agent> -- <these>` (the wrapper binds the agent itself).
HEADLESS = {
    "claude": lambda prompt: ["-p", prompt, "--output-format", "json", "--permission-mode", "acceptEdits"],
    "codex": lambda prompt: ["exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                             prompt],
    "opencode": lambda prompt: ["run", "--format", "json", prompt],
    "pi": lambda prompt: ["-p", "--mode", "json", "--offline", prompt],
}
QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
         "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
         "OPENCODE_PERMISSION": json.dumps({"edit": "allow", "bash": "allow"}), "PI_OFFLINE": "1"}


def run_wrapper(agent: str, args: list[str], home: Path, cwd: Path, timeout: float = 300,
                **extra: str) -> AgentRun:
    """`reef-lab agent <agent> <args>` (harness/install/cli.py) with its own HOME, in a process group of its own:
    the agent it starts replaces the wrapper's process, so the group holds the agent and everything it spawns."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = _env(home, PYTHONPATH=str(ROOT), **QUIET, **extra)
    cmd = [sys.executable, "-m", "reef_lab.harness.install.cli", "agent", agent, *args]
    rc, out, err, secs = run_group(cmd, env, cwd, timeout)
    return AgentRun(agent, rc, secs, out, err, cmd)


def first_model_request(agent: str, logged: list[dict]) -> dict | None:
    """The first model request of an agent's run among what a provider logged meanwhile (ScriptedProvider.requests
    since the run began), or None: the first POST, for opencode the first that carries its tools (its title call
    comes first)."""
    posts = [r for r in logged if r["method"] == "POST"]
    if agent == "opencode":
        posts = [r for r in posts if (r["body"] or {}).get("tools")]
    return posts[0] if posts else None


class ReefServer:
    """`scripts/serve.py --upstream-url <provider>` as a child process group, killed on exit."""

    def __init__(self, upstream: str, data_dir: Path, port: int, dialect: str | None = None, workers: int = 0,
                 extra: list[str] | None = None):
        self.url = f"http://127.0.0.1:{port}"
        self.cmd = [sys.executable, str(serve_script()), "--port", str(port), "--data-dir",
                    str(data_dir), "--upstream-url", upstream, "--log-level", "warning", "--workers", str(workers),
                    *(["--upstream-dialect", dialect] if dialect else []), *(extra or [])]
        self.proc: subprocess.Popen | None = None
        self.log = data_dir.parent / f"serve-{port}.log"

    def __enter__(self) -> ReefServer:
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "wb"))
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve.py exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=2).close()
                return self
            except OSError:
                time.sleep(0.3)
        self.__exit__()
        raise TimeoutError("serve.py did not answer /healthz within 120 s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def episode(self, scenario: str, episode: str) -> dict:
        return episode_of(self.url, scenario, episode)

    def records(self, scenario: str) -> list[dict]:
        return records_of(self.url, scenario)


def harness_server(provider_url: str, work: Path, seed_harness: dict) -> ReefServer:
    """`scripts/serve.py` in front of the scripted provider at `provider_url`, new scenarios on GEPA in manual mode
    from `seed_harness`, their change requests proposed by the same provider (it plays the proposer model); its
    data and recipe config under `work`. Enter it to start the server."""
    import yaml

    config = work / "gepa.yaml"
    config.write_text(yaml.safe_dump({"mode": "manual", "seed_harness": seed_harness, "requests": {
        "proposer_lm": {"kind": "openai", "base_url": provider_url, "model": "scripted"}}}))
    extra = ["--upstream-model", "scripted-model", "--recipe", "gepa", "--recipe-config", str(config)]
    return ReefServer(provider_url, work / "data", free_port(), extra=extra)


def episode_of(url: str, scenario: str, episode: str) -> dict:
    """GET /reef/episodes/<episode>: the episode's calls in turn order."""
    req = urllib.request.Request(f"{url}/reef/episodes/{episode}", headers={"x-reef-scenario": scenario})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def records_of(url: str, scenario: str) -> list[dict]:
    """The scenario's records, oldest first (GET /reef/scenarios/<name>/records, every page)."""
    out, after = [], None
    while True:
        q = "?limit=1000" + (f"&after={after}" if after else "")
        with urllib.request.urlopen(f"{url}/reef/scenarios/{scenario}/records{q}", timeout=30) as r:
            page = json.loads(r.read())
        out += page["records"]
        after = page.get("next")
        if not after:
            return out
