"""Measure harness installs into real coding agents: what each agent's first model request carries after install,
after a change request (evolve) and update, and after a rollback and update; with times and request counts.

The same flow as tests/test_agents_harness.py (marker agents), as a user runs it: `scripts/serve.py` (a gepa
scenario in manual mode) in front of the scripted provider (reef_lab/testing/scripted_provider.py: it logs every body
and plays the change-request proposer), and `reef-lab agent <agent> install | run | report | evolve --wait | update`
as subprocesses with their own HOME. Needs the agents: `bash scripts/setup.sh --agents`.

    .venv/bin/python scripts/studies/check_agents_install.py [--agents claude,codex,opencode,pi] [--out results/harness-install]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from reef_lab.testing.agents import BIN, HEADLESS, first_model_request, harness_server, installed, run_wrapper, version
from reef_lab.testing.scripted_provider import ScriptedProvider
from scripts.common import ROOT
from scripts.command_line import command_line, data_file

SEED = {"system_prompt.md": "You are a careful engineer.", "rules.md": "- RULE-ALPHA-7 run the tests before you stop",
        "skills/tidy.md": "---\nname: tidy\ndescription: SKILL-BETA-7 sort the imports\n---\nSort them."}
HOME = "<agent home>"  # stands for the agent's temporary HOME in what its wrapper said: a page names no tmp folder
MARKS = {"installed rule": "RULE-ALPHA-7", "installed skill": "SKILL-BETA-7", "evolved text": "REEF-EVOLVED-7",
         "serving's own rendering (must be absent)": "Rules:"}


def one_agent(agent: str, work: Path) -> dict:
    home, cwd = work / "home", work / "cwd"
    phases: list[dict] = []
    with ScriptedProvider() as provider:
        with harness_server(provider.url, work, SEED) as reef:
            requests.post(reef.url + "/reef/scenarios", json={"name": "s"}).raise_for_status()

            def step(name: str, *args: str) -> dict:
                run = run_wrapper(agent, list(args), home, cwd, timeout=600)
                said = [x for x in run.stdout.strip().splitlines() if not x.startswith(("run it:", "{"))]
                out = " / ".join(said).replace(str(home), HOME)[:200]
                if run.returncode:
                    out += run.stderr.strip().replace(str(home), HOME)[-200:]
                row = {"phase": name, "rc": run.returncode, "seconds": round(run.seconds, 2), "out": out}
                phases.append(row)
                return row

            def task(name: str, word: str) -> dict:
                target = cwd / f"{word}.txt"
                since = len(provider.requests)
                row = step(name, "--bin", str(BIN / agent), "--", *HEADLESS[agent](
                    f"REEF-TASK path={target} content={word}"))
                posts = [r for r in provider.requests[since:] if r["method"] == "POST"]
                first = first_model_request(agent, provider.requests[since:])
                body = json.dumps(first["body"]) if first else ""
                row.update({"model_requests": len(posts), "first_request_path": first and first["path"],
                            "first_request_bytes": len(body), "file_written": target.exists()
                            and target.read_text().strip() == word,
                            "carries": {k: v in body for k, v in MARKS.items()},
                            "release_of_last_record": reef.records("s")[-1].get("release_id")})
                return row

            scripts = lint_scripts(reef.url, work)
            step("install v1", "install", "--url", reef.url, "--scenario", "s")
            step("install again", "install")
            task("run on v1", "one")
            step("report", "report", "--score", "0", "--feedback", "REEF-FEEDBACK-7 it did not log the change")
            step("evolve --wait", "evolve", f"REEF-EVOLVED-7 log every change in CHANGES.md ({agent})", "--wait",
                 "--timeout", "600")
            step("update", "update")
            task("run on v2", "two")
            t0 = time.perf_counter()
            requests.post(reef.url + "/reef/scenarios/s/rollback", json={"release_id": "v1"}).raise_for_status()
            phases.append({"phase": "rollback (server)", "rc": 0, "seconds": round(time.perf_counter() - t0, 2)})
            step("update", "update")
            task("run after rollback", "three")
    return {"agent": agent, "version": version(agent), "phases": phases, "install_scripts": scripts}


def lint_scripts(url: str, work: Path) -> dict:
    """Every adapter's install script for the scenario: its size, and `sh -n`, `dash -n`, shellcheck's verdicts."""
    out = {}
    for adapter in ("claude", "codex", "opencode", "pi", "files"):
        r = requests.get(f"{url}/reef/harness/install", params={"adapter": adapter, "scenario": "s"})
        r.raise_for_status()
        path = work / f"install-{adapter}.sh"
        path.write_bytes(r.content)
        checks = {"bytes": len(r.content)}
        for name, cmd in (("sh -n", ["sh", "-n"]), ("dash -n", ["dash", "-n"]), ("shellcheck", ["shellcheck"])):
            if shutil.which(cmd[0]):
                done = subprocess.run([*cmd, str(path)], capture_output=True, text=True)
                checks[name] = "clean" if done.returncode == 0 and not done.stdout.strip() else done.stdout[:300]
        out[adapter] = checks
    return out


def summary(rows: list[dict]) -> str:
    """How many agents carried the expected text in each run's first request (and nothing they should not)."""
    want = {"run on v1": (True, True, False), "run on v2": (True, True, True), "run after rollback": (True, True, False)}
    parts = []
    for phase, (rule, skill, evolved) in want.items():
        good = [r["agent"] for r in rows for p in r["phases"] if p["phase"] == phase and p["rc"] == 0
                and p["file_written"] and tuple(p["carries"].values()) == (rule, skill, evolved, False)]
        parts.append(f"{phase}: {len(good)} of {len(rows)} ({', '.join(good) or 'none'})")
        parts[-1] += " carried the installed rule and skill" + (" and the evolved text" if evolved else
                                                                 ", not the evolved text")
    return "**As expected** (and serving's rendering absent, the task's file written): " + "; ".join(parts) + "."


def markdown(rows: list[dict], command: str) -> str:
    lines = ["# Harness releases installed into real coding agents", "",
             f"Command: `{command}` (scripts/studies/check_agents_install.py; scripted provider, serve.py, `reef-lab agent`).",
             "Each run's first model request (opencode: the first with its tools) searched for the installed rule "
             "(`RULE-ALPHA-7`), the installed skill's description (`SKILL-BETA-7`), the change request's text "
             "(`REEF-EVOLVED-7`, in the evolved rule and skill) and serving's own rendering (`Rules:`, must be absent: "
             "the agent carries the release in its own files, serving does not apply it twice).", "",
             summary(rows), "",
             "| agent | run | rc | s | model requests | first request (KB) | rule | skill | evolved | `Rules:` | "
             "file written | record's release |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    yn = {True: "yes", False: "no"}
    for r in rows:
        for p in r["phases"]:
            if "carries" not in p:
                continue
            c = list(p["carries"].values())
            lines.append(f"| {r['agent']} {r['version']} | {p['phase']} | {p['rc']} | {p['seconds']} | "
                         f"{p['model_requests']} | {p['first_request_bytes'] / 1000:.1f} | {yn[c[0]]} | {yn[c[1]]} | "
                         f"{yn[c[2]]} | {yn[c[3]]} | {yn[p['file_written']]} | {p['release_of_last_record']} |")
    if rows:
        lines += ["", "Install scripts (`GET /reef/harness/install?adapter=...`, the seed release):", "",
                  "| adapter | bytes | sh -n | dash -n | shellcheck |", "|---|---|---|---|---|"]
        for adapter, c in rows[0]["install_scripts"].items():
            lines.append(f"| {adapter} | {c['bytes']} | {c.get('sh -n', '-')} | {c.get('dash -n', '-')} | "
                         f"{c.get('shellcheck', 'not installed')} |")
    lines += ["", "Wrapper steps (seconds, exit status, what it said):", "",
              "| agent | step | rc | s | says |", "|---|---|---|---|---|"]
    for r in rows:
        for p in r["phases"]:
            if "carries" not in p:
                said = re.sub(rf"({re.escape(HOME)}\S*)", r"`\1`", p.get("out", "").replace("|", "/"))
                lines.append(f"| {r['agent']} | {p['phase']} | {p['rc']} | {p['seconds']} | {said} |")
    lines += ["", f"`{HOME}`: the HOME each agent's wrapper ran with, a temporary folder made for the agent and "
              "removed after it."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default="claude,codex,opencode,pi", help="comma-separated agents to run")
    ap.add_argument("--out", default=str(ROOT / "results" / "harness-install"), help="output path without suffix")
    a = ap.parse_args()
    rows = []
    for agent in a.agents.split(","):
        if not installed(agent):
            print(f"{agent}: not installed (bash scripts/setup.sh --agents)", file=sys.stderr)
            continue
        work = Path(tempfile.mkdtemp(prefix=f"reef-install-{agent}-"))
        try:
            rows.append(one_agent(agent, work))
            print(json.dumps(rows[-1]), flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    command = command_line()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    data_file(a.out).write_text(json.dumps({"command": command, "agents": rows}, indent=2) + "\n")
    Path(a.out + ".md").write_text(markdown(rows, command))
    print(Path(a.out + ".md").read_text())


if __name__ == "__main__":
    main()
