"""`reef-lab agent`: run a coding agent on an installed harness release, bound to reef_lab, and talk back.

    reef-lab agent claude install --url http://127.0.0.1:8900 --scenario mine   # the serving release
    reef-lab agent claude -p "fix the failing test"       # check the tree, then run Claude Code (fresh session)
    reef-lab agent claude report --score 1 --feedback "good, but it forgot the changelog"
    reef-lab agent claude evolve "always update CHANGELOG.md when you change behaviour" --wait
    reef-lab agent claude update                           # install the release that serves now
    reef-lab agent claude versions | doctor | install v2

The harness files live in `<root>/<agent>` (root: --root, $REEF_HARNESS_ROOT, else ~/reef-harness/<scenario>),
written by the install script the server renders (reef_lab/harness/install/script.py); this command fetches and runs it.
Before each run it checks every harness file against the release file and refuses a tree that differs. Each run
gets a fresh session id, sent as `x-reef-session` and the `x-reef-tag-session` tag (Claude Code also gets it as its
own `--session-id`), so `report` and `evolve` can name that session's calls. The server's token comes from
$REEF_TOKEN; it is passed to the agent in its environment, never written to a file.

The token and the install script travel only over https, or plain http to this machine (loopback); REEF_ALLOW_HTTP=1
allows plain http to another host (a LAN you trust: the token then crosses it readable). No redirect is followed
(the token would go with it). A script runs only if it is reef_lab's, whole, for the asked scenario and adapter
(reef_lab.harness.install.script.check_script).
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

from reef_lab import procs
from reef_lab.harness.install.layout import ADAPTERS, FOLDER_ENV, KEY_ENV, RELEASE_FILE, SESSION_ENV, parse_release
from reef_lab.harness.install.script import check_script

COMMANDS = ("run", "install", "update", "versions", "report", "evolve", "doctor")
HARNESS_DIRS = {"claude": ("skills", "commands"), "codex": ("skills", "prompts"), "opencode": ("skill", "command"),
                "pi": ("skills", "prompts"), "files": ()}
AGENT_OWNED = {"codex": ("skills/.system/",)}  # what the agent writes into those folders itself (Codex's own skills)
SESSIONS_FILE = ".reef-sessions"
OURS = ("--root", "--scenario", "--url", "--bin")  # the wrapper's own options, which may come before the command
DEFAULT_URL = "http://127.0.0.1:8900"


class Failed(Exception):
    """A problem the user can fix; printed as one line, exit status 1."""


# ---- the server -------------------------------------------------------------------------------------------------
ALLOW_HTTP = "REEF_ALLOW_HTTP"


def check_url(url: str) -> None:
    """Failed unless `url` is https, or plain http to this machine, or plain http allowed by REEF_ALLOW_HTTP=1: the
    token goes with every call, and `install` runs what the server answers."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Failed(f"{url!r} is not the http(s) address of a reef_lab server")
    if parts.scheme == "http" and not is_loopback(parts.hostname) and os.environ.get(ALLOW_HTTP) != "1":
        raise Failed(f"refusing plain http to {parts.hostname}, which is not this machine: REEF_TOKEN and the "
                     f"install script would cross the network readable and changeable. Use https, or on a LAN "
                     f"you trust set {ALLOW_HTTP}=1")


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """urllib follows a redirect to any host with every header, Authorization included: follow none."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        fp.close()
        raise Failed(f"{req.full_url} answered a redirect ({code}) to {newurl}; reef-lab follows none (the token "
                     "would go with it): give --url the address that answers itself")


_OPENER = urllib.request.build_opener(_NoRedirect)


def http(method: str, url: str, body: dict | None = None, scenario: str | None = None,
         timeout: float = 60.0) -> tuple[int, bytes]:
    check_url(url)
    headers = {"accept": "application/json"}
    if body is not None:
        headers["content-type"] = "application/json"
    if scenario:
        headers["x-reef-scenario"] = scenario
    if os.environ.get("REEF_TOKEN"):
        headers["authorization"] = f"Bearer {os.environ['REEF_TOKEN'].split(',')[0]}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        raise Failed(f"reef_lab at {url} is unreachable: {e}") from None


def call(method: str, url: str, body: dict | None = None, scenario: str | None = None) -> dict:
    status, data = http(method, url, body, scenario)
    check(status, data, method, url)
    return json.loads(data) if data else {}


def check(status: int, data: bytes, method: str, url: str) -> None:
    """Failed with the server's own message when it refused."""
    if status < 400:
        return
    try:
        msg = json.loads(data)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = data[:300].decode(errors="replace")
    hint = " (set REEF_TOKEN to the server's token)" if status == 401 else ""
    raise Failed(f"{method} {url} answered {status}: {msg}{hint}")


# ---- the install on disk ----------------------------------------------------------------------------------------
class Install:
    """Where an agent's harness is installed, and what its release file says."""

    def __init__(self, adapter: str, root: Path):
        self.adapter, self.root = adapter, root
        self.dir = root / adapter
        self.release_path = self.dir / RELEASE_FILE

    @classmethod
    def locate(cls, adapter: str, root: str | None, scenario: str | None) -> Install:
        root = root or os.environ.get("REEF_HARNESS_ROOT")
        if root:
            return cls(adapter, Path(root).expanduser())
        base = Path.home() / "reef-harness"
        if scenario:
            return cls(adapter, base / scenario)
        found = sorted(p.parent.parent for p in base.glob(f"*/{adapter}/{RELEASE_FILE}"))
        if len(found) == 1:
            return cls(adapter, found[0])
        if not found:
            raise Failed(f"no {adapter} install under {base}: run `reef-lab agent {adapter} install --url URL "
                         "--scenario NAME` first (or give --root)")
        raise Failed(f"several {adapter} installs ({', '.join(p.name for p in found)}): choose with --scenario")

    def exists(self) -> bool:
        return self.release_path.is_file()

    def release(self) -> dict:
        if not self.exists():
            raise Failed(f"{self.release_path} does not exist: run `reef-lab agent {self.adapter} install`")
        if self.release_path.is_symlink():
            raise Failed(f"{self.release_path} is a symbolic link; refusing to trust it")
        try:
            return parse_release(self.release_path.read_text())
        except ValueError as e:
            raise Failed(f"{self.release_path}: {e}") from None

    def problems(self) -> tuple[list[str], list[str]]:
        """(harness files that differ from the release file, config files the agent or a person changed)."""
        rel = self.release()
        bad, changed = [], []
        for path, digest in rel["files"].items():
            if _digest(self.dir / path) != digest:
                bad.append(path)
        for sub in HARNESS_DIRS[self.adapter]:
            folder = self.dir / sub
            if folder.is_symlink():
                bad.append(f"{sub} (a symbolic link)")
                continue
            for p in sorted(folder.rglob("*")) if folder.is_dir() else []:
                rp = p.relative_to(self.dir).as_posix()
                if rp.startswith(AGENT_OWNED.get(self.adapter, ())):
                    continue
                if (p.is_file() or p.is_symlink()) and rp not in rel["files"]:
                    bad.append(f"{rp} (not in the release)")
        for path, digest in rel["config"].items():
            if _digest(self.dir / path) != digest:
                changed.append(path)
        return bad, changed

    def check(self) -> dict:
        bad, changed = self.problems()
        if bad:
            raise Failed(f"the installed harness in {self.dir} differs from its release file ({', '.join(bad[:5])}"
                         f"{' and more' if len(bad) > 5 else ''}); refusing to run. Restore it with "
                         f"`reef-lab agent {self.adapter} install` or `update`")
        for path in changed:
            print(f"reef-lab: note: {self.dir / path} changed since install; `update` restores it", file=sys.stderr)
        return self.release()

    def new_session(self) -> str:
        sid = str(uuid.uuid4())
        with open(self.dir / SESSIONS_FILE, "a") as f:
            f.write(f"{time.time():.0f} {sid}\n")
        return sid

    def last_session(self) -> str:
        path = self.dir / SESSIONS_FILE
        lines = path.read_text().split() if path.exists() else []
        if not lines:
            raise Failed(f"no session has run from {self.dir} yet: run the agent first, or give --session")
        return lines[-1]


def _digest(path: Path) -> str | None:
    if path.is_symlink() or not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- commands ---------------------------------------------------------------------------------------------------
def cmd_install(a, inst: Install, release_id: str | None = None) -> int:
    url = (a.url or (inst.release()["url"] if inst.exists() else None) or os.environ.get("REEF_URL")
           or DEFAULT_URL).rstrip("/")
    scenario = a.scenario or (inst.release()["scenario"] if inst.exists() else None)
    if not scenario:
        raise Failed("which scenario? give --scenario (or $REEF_SCENARIO)")
    query = {"adapter": inst.adapter, "scenario": scenario, **({"release_id": release_id} if release_id else {})}
    where = f"{url}/reef/harness/install?{urllib.parse.urlencode(query)}"
    status, script = http("GET", where)
    check(status, script, "GET", where)
    try:
        check_script(script, inst.adapter, scenario, release_id)
    except ValueError as e:
        raise Failed(f"refusing to run what {where} answered: {e}") from None
    done = procs.run(["sh", "-s", "--", str(inst.root)], input=script)  # dies with the wrapper, kill -9 included
    return done.returncode


def cmd_run(a, inst: Install, agent_args: list[str]) -> int:
    if inst.adapter == "files":
        raise Failed("the files adapter installs a tree; it starts no agent")
    rel = inst.check()
    check_url(rel["url"])  # the agent sends the token there
    try:
        serving = call("GET", f"{rel['url']}/reef/harness", scenario=rel["scenario"])["release_id"]
        if serving != rel["release"]:
            print(f"reef-lab: note: {serving} serves now, this install is {rel['release']}: "
                  f"`reef-lab agent {inst.adapter} update` installs it", file=sys.stderr)
    except Failed as e:
        print(f"reef-lab: note: {e}", file=sys.stderr)
    binary = a.bin or os.environ.get("REEF_AGENT_BIN") or shutil.which(inst.adapter)
    if not binary:
        raise Failed(f"{inst.adapter} is not on PATH: install it, or give --bin PATH")
    sid = inst.new_session()
    token = os.environ.get("REEF_TOKEN", "").split(",")[0]
    env = {**os.environ, FOLDER_ENV[inst.adapter]: str(inst.dir), KEY_ENV: token or "reef-lab", SESSION_ENV: sid}
    args = list(agent_args)
    if inst.adapter == "claude":  # Claude Code reads no header from the environment: the session goes in --settings
        headers = (f"x-reef-scenario: {rel['scenario']}\nx-reef-harness: {rel['release']}\n"
                   f"x-reef-session: {sid}\nx-reef-tag-session: {sid}")
        env.setdefault("ANTHROPIC_API_KEY", token or "reef-lab")
        if token:
            env["ANTHROPIC_AUTH_TOKEN"] = token
        resumes = any(x in ("-c", "--continue", "-r", "--resume") or x.startswith("--resume=") for x in args)
        args = ["--settings", json.dumps({"env": {"ANTHROPIC_CUSTOM_HEADERS": headers}}),
                *([] if resumes else ["--session-id", sid]), *args]
    print(f"reef-lab: {inst.adapter} on {rel['release']} via {rel['url']}, session {sid}", file=sys.stderr)
    os.execvpe(binary, [binary, *args], env)  # the agent replaces this process: nothing is left behind
    return 0  # not reached


def session_receipts(rel: dict, sid: str) -> list[str]:
    """The receipts of the session's calls, oldest first: the gateway groups them by their session tag."""
    out, after = [], None
    query = urllib.parse.urlencode({"kind": "inference", "limit": 1000, "session": sid})
    base = f"{rel['url']}/reef/scenarios/{urllib.parse.quote(rel['scenario'])}/records?{query}"
    while True:
        page = call("GET", base + (f"&after={urllib.parse.quote(after)}" if after else ""))
        out += [r["id"] for r in page["records"]]
        after = page.get("next")
        if not after:
            return out


def cmd_report(a, inst: Install) -> int:
    rel = inst.release()
    sid = a.session or inst.last_session()
    if a.score is None and a.feedback is None:
        raise Failed("give --score and/or --feedback")
    receipts = session_receipts(rel, sid)
    if not receipts:
        raise Failed(f"no call of session {sid} is recorded in scenario {rel['scenario']!r}")
    body = {"references": receipts, "metadata": {"session": sid, "release_id": rel["release"]}}
    if a.score is not None:
        body["score"] = a.score
    if a.feedback is not None:
        body["feedback"] = a.feedback
    out = call("POST", f"{rel['url']}/reef/report", body, scenario=rel["scenario"])
    print(f"reported on session {sid} ({len(receipts)} calls): {out['agent_record_id']}")
    return 0


def cmd_evolve(a, inst: Install) -> int:
    rel = inst.release()
    body = {"text": a.text, "release_id": rel["release"]}
    sid = a.session or (inst.last_session() if (inst.dir / SESSIONS_FILE).exists() else None)
    if sid:
        body["session"] = sid
    req = call("POST", f"{rel['url']}/reef/train", body, scenario=rel["scenario"])
    print(f"change request {req['request_id']}: {req['state']}")
    if not a.wait:
        return 0
    deadline, seen = time.time() + a.timeout, req["state"]
    while time.time() < deadline:
        time.sleep(1.0)
        req = call("GET", f"{rel['url']}/reef/requests/{req['request_id']}")
        if req["state"] != seen:
            seen = req["state"]
            print(f"  {seen}" + (f": {req['why']}" if req.get("why") else ""))
        if seen in ("released", "rejected"):
            if seen == "released":
                print(f"released {req['release_id']}: `reef-lab agent {inst.adapter} update` installs it")
            return 0 if seen == "released" else 1
    raise Failed(f"change request {req['request_id']} is still {seen} after {a.timeout:.0f} s")


def cmd_versions(a, inst: Install) -> int:
    rel = inst.release()
    info = call("GET", f"{rel['url']}/reef/scenarios/{urllib.parse.quote(rel['scenario'])}/releases")
    for r in info["releases"]:
        marks = [m for m, on in (("serving", r["release_id"] == info["serving"]),
                                 ("installed", r["release_id"] == rel["release"])) if on]
        origin = (r.get("request") or {}).get("text") or r.get("recipe") or ""
        hub = (r.get("hub") or {}).get("state", "")
        print(f"{r['version']:>5}  {time.strftime('%Y-%m-%d %H:%M', time.localtime(r['created_at']))}  "
              f"{','.join(marks):<17} {hub:<8} {origin[:70]}")
    return 0


def cmd_doctor(a, inst: Install) -> int:
    ok = True

    def line(good: bool, what: str) -> None:
        nonlocal ok
        ok &= good
        print(f"{'ok ' if good else 'BAD'}  {what}")
    line(inst.exists(), f"install: {inst.dir}" + ("" if inst.exists() else " (none: run install)"))
    if not inst.exists():
        return 1
    rel = inst.release()
    bad, changed = inst.problems()
    line(not bad, "harness files match the release file" if not bad else f"harness files differ: {bad[:5]}")
    if changed:
        print(f"note {', '.join(changed)} changed since install (update restores)")
    try:
        status, _ = http("GET", f"{rel['url']}/healthz", timeout=10)
        line(status == 200, f"reachable: {rel['url']} (healthz {status})")
        status, _ = http("GET", f"{rel['url']}/reef/status", timeout=10)
        line(status == 200, "token accepted" if status == 200 else
             f"token: /reef/status answered {status} (REEF_TOKEN {'set' if os.environ.get('REEF_TOKEN') else 'unset'})")
        serving = call("GET", f"{rel['url']}/reef/harness", scenario=rel["scenario"])["release_id"]
        line(serving == rel["release"], f"versions: installed {rel['release']}, serving {serving}"
             + ("" if serving == rel["release"] else f" (run `reef-lab agent {inst.adapter} update`)"))
    except Failed as e:
        line(False, str(e))
    if inst.adapter != "files":
        binary = a.bin or os.environ.get("REEF_AGENT_BIN") or shutil.which(inst.adapter)
        version = ""
        if binary:
            try:
                version = procs.run([binary, "--version"], capture_output=True, text=True,
                                         timeout=60).stdout.strip().splitlines()[0]
            except (OSError, subprocess.TimeoutExpired, IndexError) as e:
                version = f"(--version failed: {e})"
        line(bool(binary), f"agent: {binary or inst.adapter + ' not on PATH (give --bin)'} {version}")
        print(f"     run it yourself: {FOLDER_ENV[inst.adapter]}={inst.dir} {KEY_ENV}=<token or any> {inst.adapter}")
    print(f"     release file: {inst.release_path}; config: {', '.join(rel['config']) or 'none'}")
    return 0 if ok else 1


# ---- argument parsing -------------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reef-lab", description="reef_lab's command line.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="group", required=True, metavar="agent|token")
    agent = sub.add_parser("agent", help="run a coding agent on an installed harness release", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    agent.add_argument("adapter", choices=ADAPTERS, help="the agent: claude, codex, opencode, pi (files: a plain tree)")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", help="install root (default $REEF_HARNESS_ROOT, else ~/reef-harness/<scenario>)")
    common.add_argument("--scenario", default=os.environ.get("REEF_SCENARIO"),
                        help="scenario (default $REEF_SCENARIO, else the one installed)")
    common.add_argument("--url", help=f"reef_lab's base URL (default: the install's, else $REEF_URL, else {DEFAULT_URL})")
    common.add_argument("--bin", help="the agent's executable (default $REEF_AGENT_BIN, else its name on PATH)")
    cmds = agent.add_subparsers(dest="command", metavar="command")

    def add(name: str, text: str) -> argparse.ArgumentParser:
        return cmds.add_parser(name, parents=[common], help=text, description=text)
    run = add("run", "(the default) check the tree, start the agent bound to reef_lab with a fresh session; the "
                     "rest of the line goes to the agent")
    run.add_argument("agent_args", nargs=argparse.REMAINDER, help="arguments for the agent")
    ins = add("install", "install a release (default: the serving one) with the script the server renders")
    ins.add_argument("release", nargs="?", help="vN or <scenario>:vN")
    add("update", "install the release that serves now (says 'already current' when it is)")
    add("versions", "the scenario's releases: which serves, which is installed, the request each answers")
    rep = add("report", "score and/or feedback on a session's calls (default: the last run's)")
    rep.add_argument("--score", type=float, help="a number (e.g. 0 or 1)")
    rep.add_argument("--feedback", help="what was good or wrong, in words")
    rep.add_argument("--session", help="the session id (default: the last run)")
    evo = add("evolve", "ask for a change in plain words: a change request a proposer model turns into a new "
                        "release (docs/harness.md)")
    evo.add_argument("text", help='what to change, e.g. "always run the tests before you say done"')
    evo.add_argument("--session", help="the session it is about (default: the last run)")
    evo.add_argument("--wait", action="store_true", help="wait until it is released or rejected")
    evo.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (default 600)")
    add("doctor", "check the install, its files, the server, the token, the versions, the agent and the paths")
    token_parser(sub)
    return p


def token_parser(sub) -> None:
    """`reef-lab token add|hash`: the operator's tokens file (reef_lab/tenants.py, docs/api.md#tokens)."""
    from reef_lab.tenants import ROLES

    tok = sub.add_parser("token", help="make a token scoped to scenarios and a role (the server's tokens file)",
                         description="The server's tokens file (--tokens-file) lists each token by its sha256; "
                                     "`add` makes a token, writes its entry and prints the token once.")
    cmds = tok.add_subparsers(dest="command", required=True, metavar="add|revoke|hash")
    add = cmds.add_parser("add", help="make a token, add it to the file (or the shared state), print it once")
    where = add.add_mutually_exclusive_group(required=True)
    where.add_argument("--file", help="the tokens file (created when missing; the server reads it at start)")
    where.add_argument("--state", help="a shared deployment's PostgreSQL URL (postgresql://user@host:port/db): "
                                       "every gateway takes the token within seconds, no restart")
    add.add_argument("--role", required=True, choices=ROLES, help="agent < reader < admin (each holds the rights "
                                                                   "of those before it)")
    add.add_argument("--scenario", action="append", required=True, dest="scenarios",
                     help="a scenario name or fnmatch pattern ('team-a-*'; '*': every one); repeat for more")
    add.add_argument("--name", help="a label for the operator (who holds the token)")
    rev = cmds.add_parser("revoke", help="take a token out of the file (or the shared state) by its id")
    rev.add_argument("id", help="the token's id: the first 16 hex digits of its sha256 (records and status show it)")
    where = rev.add_mutually_exclusive_group(required=True)
    where.add_argument("--file", help="the tokens file (the server reads it at start: restart it)")
    where.add_argument("--state", help="a shared deployment's PostgreSQL URL: every gateway refuses the token "
                                       "within seconds")
    cmds.add_parser("hash", help="print the sha256 of a token read from stdin (to write an entry by hand)")


def cmd_token(a) -> int:
    from reef_lab import tenants

    if a.command == "hash":
        token = sys.stdin.readline().strip()
        if not token:
            raise Failed("give the token on stdin, e.g. `printf %s \"$TOKEN\" | reef-lab token hash`")
        print(tenants.digest(token))
        return 0
    from reef_lab.errors import ReefError

    state = None
    try:
        if a.state:
            from reef_lab.state import check_spec, open_state

            state = open_state(check_spec(a.state), "cli")
        if a.command == "revoke":
            entry = tenants.revoke_shared_token(state, a.id) if state else tenants.revoke_token(a.file, a.id)
            print(f"revoked token {a.id} ({entry['role']} of {', '.join(entry['scenarios'])})"
                  + (": every gateway refuses it within seconds" if state else f" in {a.file}: restart the server"),
                  file=sys.stderr)
            return 0
        if state:
            token, token_id = tenants.add_shared_token(state, a.role, a.scenarios, a.name)
        else:
            token, token_id = tenants.add_token(a.file, a.role, a.scenarios, a.name)
    except (ValueError, ReefError) as e:
        raise Failed(str(e)) from None
    finally:
        if state is not None:
            state.close()
    where = "the shared state: every gateway takes it within seconds" if state else \
        f"{a.file}; restart the server to use it"
    print(f"added token {token_id} ({a.role} of {', '.join(a.scenarios)}) to {where}. The token (shown only now, "
          "only its sha256 is kept):", file=sys.stderr)
    print(token)
    return 0


def split_run(argv: list[str]) -> list[str]:
    """`reef-lab agent claude -p hi` means `... claude run -p hi`; our own options may lead the agent's, and lead
    a command too (`... claude --scenario s evolve "x"` is `... claude evolve --scenario s "x"`)."""
    if len(argv) < 2 or argv[0] != "agent" or argv[1] not in ADAPTERS:
        return argv
    rest = argv[2:]
    if rest and (rest[0] in COMMANDS or rest[0] in ("-h", "--help")):
        return argv
    ours, i = [], 0
    while i < len(rest) and i + 1 < len(rest) and (rest[i] in OURS or rest[i].split("=")[0] in OURS):
        step = 1 if "=" in rest[i] else 2
        ours += rest[i:i + step]
        i += step
    if i < len(rest) and rest[i] in COMMANDS:
        return [*argv[:2], rest[i], *ours, *rest[i + 1:]]
    if i < len(rest) and rest[i] == "--":
        i += 1
    return [*argv[:2], "run", *ours, "--", *rest[i:]]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(split_run(list(sys.argv[1:] if argv is None else argv)))
    if args.group == "token":
        try:
            return cmd_token(args)
        except Failed as e:
            print(f"reef-lab: {e}", file=sys.stderr)
            return 1
    command = args.command or "run"
    try:
        inst = Install.locate(args.adapter, getattr(args, "root", None), getattr(args, "scenario", None))
        if command == "install":
            return cmd_install(args, inst, args.release)
        if command == "update":
            return cmd_install(args, inst, None)
        if command == "run":
            agent_args = getattr(args, "agent_args", [])
            return cmd_run(args, inst, agent_args[1:] if agent_args[:1] == ["--"] else agent_args)
        return {"report": cmd_report, "evolve": cmd_evolve, "versions": cmd_versions,
                "doctor": cmd_doctor}[command](args, inst)
    except Failed as e:
        print(f"reef-lab: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
