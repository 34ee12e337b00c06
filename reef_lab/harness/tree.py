"""The harness: a scenario's versioned tree of text files (system prompt, rules, skills) that serving applies.

A harness release is a folder of text files; these names have a meaning, any others are kept and served to
clients as they are:

    system_prompt.md     the system prompt
    rules.md             rules, appended under a "Rules" heading
    skills/<name>.md     one skill each, appended under "Skills", by name (sorted); optional YAML front matter
                         (`name`, `description`) as agents' SKILL.md files have
    commands/<name>.md   a command a person invokes (an agent's slash command); not applied, installed

Serving joins them into one system text and puts it in front of the client's own instructions, in the dialect's
place for it (reef_lab.wire.dialects.with_system): OpenAI chat, a first system message; OpenAI responses,
`instructions`; Anthropic, `system`. The client's own system text is kept after it. The record keeps the client's
request as sent and names the harness release; `GET /reef/harness` returns `{release_id, files}` so a client can
install the harness itself.

A tree is checked and parsed once, when it is released (`check_release`, by the releaser, whoever made it): paths
and sizes, skills' and commands' front matter within YAML's limits (reef_lab.bounded_yaml: no alias, bounded depth
and size), and nothing an agent would run unless the operator allows it. Serving and the install script use the
parsed `Harness` (its system text made once); no YAML is read on a request.
A client that carries an installed release in its own files (reef_lab/harness/install/: CLAUDE.md, skills, ...) says so
with the `x-reef-harness: <scenario>:vN` header: the serving harness is then not applied a second time, and the
record names the installed release.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from reef_lab import bounded_yaml
from reef_lab.errors import BadRequest

SYSTEM_PROMPT, RULES, SKILLS, COMMANDS = "system_prompt.md", "rules.md", "skills/", "commands/"
INSTALLED_HEADER = "x-reef-harness"
MAX_FILES, MAX_BYTES = 200, 1_000_000
RESERVED = {"README.md", "reef_checkpoint.json"}  # a release folder's own files, written beside the harness
MAX_NAME_BYTES, MAX_DEPTH = 200, 8  # per path part (filesystems stop at 255), parts per path
MAX_FRONT_BYTES = 64 << 10  # a skill's or command's front matter


def check_files(files: object) -> dict[str, str]:
    """A harness tree from a client: relative POSIX paths, text contents, bounded size."""
    if not isinstance(files, dict) or not files:
        raise BadRequest("'files' must be a non-empty object {path: text}")
    if len(files) > MAX_FILES:
        raise BadRequest(f"a harness holds at most {MAX_FILES} files")
    total = 0
    for path, text in files.items():
        check_path(path)
        if not isinstance(text, str):
            raise BadRequest(f"harness file {path!r} must hold text")
        try:
            total += len(text.encode())
        except UnicodeEncodeError:
            raise BadRequest(f"harness file {path!r} holds an unpaired surrogate; send UTF-8 text") from None
        if "\x00" in text:
            raise BadRequest(f"harness file {path!r} holds a NUL character; send plain text")
    if total > MAX_BYTES:
        raise BadRequest(f"the harness holds {total} bytes; at most {MAX_BYTES}")
    dirs = {str(parent) for path in files for parent in PurePosixPath(path).parents if str(parent) != "."}
    clash = sorted(dirs & set(files))
    if clash:
        raise BadRequest(f"harness path {clash[0]!r} is both a file and a folder of other files; rename one")
    return dict(files)


def check_path(path: object) -> None:
    """A path every filesystem we run on can hold, inside the release folder, that reads back as written."""
    shown = repr(path)[:80] + ("..." if len(repr(path)) > 80 else "")
    rule = (f"must be a relative path like 'rules.md' or 'skills/x.md': printable, '/' between at most {MAX_DEPTH} "
            f"parts of at most {MAX_NAME_BYTES} bytes, no '.', '..' or '\\', and not {sorted(RESERVED)}")
    if not isinstance(path, str) or not path:
        raise BadRequest(f"harness path {shown} {rule}")
    try:
        sizes = [len(p.encode()) for p in path.split("/")]
    except UnicodeEncodeError:
        raise BadRequest(f"harness path {shown} holds an unpaired surrogate") from None
    parts = path.split("/")
    if (len(parts) > MAX_DEPTH or path in RESERVED or max(sizes) > MAX_NAME_BYTES or "\\" in path
            or any(p in ("", ".", "..") for p in parts) or not path.isprintable()):
        raise BadRequest(f"harness path {shown} {rule}")


def write_tree(folder: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def read_tree(folder: Path) -> dict[str, str]:
    """The harness files of a release folder: every file but the folder's own (RESERVED, at its top only: a
    nested README.md is a harness file like any other)."""
    folder = Path(folder)
    paths = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
    # bytes decoded, not read_text: its newline translation would turn a file's \r\n into \n
    return {rel: p.read_bytes().decode("utf-8") for rel, p in paths.items() if rel not in RESERVED}


# ---- the tree as serving uses it: parsed once -------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Harness:
    """A checked harness tree and what serving and the install script need of it, made once when it is released
    or loaded (never on a request): each skill's and command's front matter and body, and the system text serving
    puts in front of each request."""

    files: dict[str, str]
    fronts: dict[str, tuple[dict, str]]  # the files under skills/ and commands/: (front matter, body)
    system: str


def load(files: object) -> Harness:
    """The Harness of a file tree: its paths and sizes checked (check_files) and each skill's and command's front
    matter parsed within YAML's limits (reef_lab.bounded_yaml); BadRequest names the file and what is wrong."""
    files = check_files(files)
    fronts = {p: front_matter(p, t) for p, t in files.items() if has_front_matter(p)}
    return Harness(files, fronts, _system_text(files, fronts))


def has_front_matter(path: str) -> bool:
    """Whether a file's front matter has a meaning (name, description): a skill's or a command's."""
    return path.startswith((SKILLS, COMMANDS))


def front_matter(path: str, text: str) -> tuple[dict, str]:
    """(front matter, body) of a skill or command that may open with a `---` YAML block (as SKILL.md files do);
    ({}, text) without one. A block that is not a YAML mapping, holds an alias, nests deeper than
    MAX_CONFIG_DEPTH or is over MAX_FRONT_BYTES is refused (BadRequest naming the file)."""
    m = _FRONT.match(text)
    if not m:
        return {}, text
    where = f"harness file {path!r}: its front matter (the block between the '---' lines)"
    try:
        meta = bounded_yaml.load_text(m.group(1), where, MAX_FRONT_BYTES, "front matter")
    except ValueError as e:
        raise BadRequest(f"{e}; front matter is a YAML mapping such as 'name: x' and 'description: when to use "
                         "it'") from None
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise BadRequest(f"{where} must be a YAML mapping (name: ..., description: ...), got a "
                         f"{type(meta).__name__}")
    return meta, text[m.end():]


_FRONT = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.S)


def skill_text(path: str, meta: dict, body: str) -> str:
    """A skill as serving shows it: its name, its description (front matter) and its body."""
    name = str(meta.get("name") or PurePosixPath(path).stem)
    desc = str(meta.get("description") or "").strip()
    return f"## {name}\n" + (f"{desc}\n\n" if desc else "") + body.strip()


def system_text(files: dict[str, str]) -> str:
    """The system text of a file tree (its skills' front matter parsed now, within limits; serving uses the one a
    Harness keeps)."""
    return _system_text(files, {p: front_matter(p, t) for p, t in files.items() if has_front_matter(p)})


def _system_text(files: dict[str, str], fronts: dict[str, tuple[dict, str]]) -> str:
    parts = []
    if files.get(SYSTEM_PROMPT, "").strip():
        parts.append(files[SYSTEM_PROMPT].strip())
    if files.get(RULES, "").strip():
        parts.append("Rules:\n" + files[RULES].strip())
    skills = sorted((p, t) for p, t in files.items() if p.startswith(SKILLS) and t.strip())
    if skills:
        parts.append("Skills:\n" + "\n\n".join(skill_text(p, *fronts[p]) for p, _ in skills))
    return "\n\n".join(parts)


# ---- what a release may hold: one check for every way a harness is released ------------------------------------
TEXT_SUFFIXES = (".md", ".markdown", ".txt", ".rst", ".json", ".jsonl", ".yaml", ".yml", ".toml", ".csv", ".tsv",
                 ".xml", ".html", ".htm", ".css", ".ini", ".cfg")
_INLINE_SHELL = re.compile(r"!`")  # Claude Code's and opencode's !`command`, anywhere in a line
_FENCED_SHELL = re.compile(r"(?m)^[ \t]*(?:`{3,}|~{3,})[ \t]*!")  # Claude Code's ```! block
_GRANTS = re.compile(r"(?im)(?:^|[{,])[ \t]*[\"']?(allowed[ \t_-]*tools|hooks|permissions?)[\"']?[ \t]*:")  # a key
ALLOW_FLAG = "--harness-allow-executable"


def check_release(files: object, allow_executable: bool = False) -> Harness:
    """The Harness of a tree that is about to be released (load), refused (BadRequest naming the file) when it holds
    anything an agent would run or that widens what it may run, unless the operator allows it: a file that is not
    plain text by its name (TEXT_SUFFIXES; compared in lower case, Unicode-normalised, with trailing spaces and dots
    dropped), a `#!` first line, a Claude Code / opencode shell injection (`!` and a backtick anywhere in a line, or
    a fence opened with `!`), or front matter that grants tools or runs hooks (`allowed-tools`, `hooks`,
    `permission`, in any case or spelling with `_` or spaces, in its text or as a key at any depth once parsed;
    front matter that does not parse is refused too). Publishing by hand, GEPA and change requests all
    come through here (reef_lab.publishing.releaser)."""
    tree = load(files)
    if not allow_executable:
        for path, text in tree.files.items():
            why = executable_why(path, text)
            if why:
                raise BadRequest(f"harness file {path!r} {why}; a harness release holds nothing an agent runs "
                                 f"unless the server's operator starts it with {ALLOW_FLAG} 1")
    return tree


def executable_why(path: str, text: str) -> str | None:
    """What makes a harness file executable (or lets an agent run more), or None."""
    name = re.sub(r"[\s.]+$", "", unicodedata.normalize("NFKC", PurePosixPath(path).name).lower())
    if not name.endswith(TEXT_SUFFIXES):
        return (f"would be an executable file: only plain text files ({', '.join(TEXT_SUFFIXES)}) are released, "
                "named in any case")
    body = unicodedata.normalize("NFKC", text)
    if body.lstrip("\ufeff \t\r\n").startswith("#!"):
        return "would be an executable file: it starts with #!"
    if _INLINE_SHELL.search(body) or _FENCED_SHELL.search(body):
        return "holds a !`command` (or a ```! block), which an agent runs as a shell command"
    front = _FRONT.match(body.lstrip("\ufeff"))
    grant = _GRANTS.search(front.group(1)) if front else None
    if grant:
        return (f"has {grant.group(1)!r} in its front matter (allowed-tools, hooks and permission let an agent run "
                "commands without asking)")
    return _parsed_grant_why(path, text)


def _parsed_grant_why(path: str, text: str) -> str | None:
    """The text check above misses a key that is `allowed-tools` only once parsed (`? allowed-tools`, an anchor or
    a tag before it, `"allowed\\x2dtools"`): the front matter, as written, is parsed with the bounded reader and
    its keys at every depth compared like the text (any case, `_`, `-` or spaces). Front matter that does not parse
    is refused, since an agent's own reader may find keys in it that this one cannot."""
    front = _FRONT.match(text.lstrip("\ufeff"))
    if not front:
        return None
    try:
        meta = bounded_yaml.load_text(front.group(1), "its front matter", MAX_FRONT_BYTES, "front matter")
    except ValueError as e:
        return (f"has front matter that is not YAML within the bounded reader's limits ({e}), so no check can say "
                "whether it grants an agent tools or runs hooks")
    for key in _keys(meta):
        if _GRANT_KEY.fullmatch(re.sub(r"[ \t_-]", "", unicodedata.normalize("NFKC", str(key)).casefold())):
            return (f"has the key {key!r} in its front matter (allowed-tools, hooks and permission let an agent run "
                    "commands without asking)")
    return None


_GRANT_KEY = re.compile(r"allowedtools|hooks|permissions?")


def _keys(value: object):
    """Every mapping key in a parsed YAML value, at any depth (bounded_yaml bounds the depth)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _keys(v)
    elif isinstance(value, list):
        for v in value:
            yield from _keys(v)


_INSTALLED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}:v[1-9][0-9]{0,8}$")


def installed_release(scenario: str, headers: dict[str, str] | None) -> str | None:
    """The harness release a client says it carries in its own files (header `x-reef-harness`), or None.
    It must name a release of this scenario (`<scenario>:vN`); anything else is refused, never recorded."""
    value = (headers or {}).get(INSTALLED_HEADER)
    if value is None:
        return None
    if not _INSTALLED.match(value) or value.rsplit(":", 1)[0] != scenario:
        raise BadRequest(f"header {INSTALLED_HEADER} must name a harness release of scenario {scenario!r} as "
                         f"'{scenario}:vN' (the release the client installed), got {value[:80]!r}")
    return value
