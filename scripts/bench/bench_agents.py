"""What reef_lab's relay adds to each call of a real agent: Claude Code, Codex CLI and opencode, headless, on the
scripted two-turn file task, straight to the scripted provider (the baseline) and through `scripts/serve.py`, in the
agent's own dialect and translated to each other dialect, side by side (the routes take turns within every round).

Every call is timed by the same loopback proxy in front of the agent's base URL (reef_lab/testing/timing_proxy.py),
from the request's first byte to the answer's last, so a route's time per call minus the baseline's is what the
relay adds. Needs the agents: `bash scripts/setup.sh --agents`.

    .venv/bin/python scripts/bench/bench_agents.py --rounds 5        # writes results/agents.md and results/data/agents.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from reef_lab.testing import free_port
from reef_lab.testing.agents import AGENTS, RUNNERS, ReefServer, installed, version
from reef_lab.testing.scripted_provider import DONE_TEXT, ScriptedProvider
from reef_lab.testing.timing_proxy import TimingProxy
from scripts.common import ROOT
from scripts.command_line import command_line, data_file

OWN = {"claude": "anthropic", "codex": "openai-responses", "opencode": "openai-chat"}
INFERENCE = ("/v1/messages", "/v1/chat/completions", "/v1/responses")  # Claude Code also sends a HEAD / at start
DIALECTS = ("anthropic", "openai-chat", "openai-responses")


def routes(agent: str) -> list[str]:
    """direct (the baseline), relay (same dialect), then relay translated to each other dialect."""
    return ["direct", "relay"] + [f"relay->{d}" for d in DIALECTS if d != OWN[agent]]


def one_run(agent: str, route: str, base_port: int, work: Path, tag: str) -> dict:
    target = work / "cwd" / "out.txt"
    target.parent.mkdir(parents=True)
    content = f"bench-{tag}"
    with TimingProxy(base_port) as proxy:
        run = RUNNERS[agent](proxy.url, f"REEF-TASK path={target} content={content}", work, tag)
    calls = proxy.times_ms()
    ok = run.returncode == 0 and target.exists() and target.read_text().strip() == content and DONE_TEXT in run.stdout
    return {"agent": agent, "route": route, "ok": ok, "wall_s": round(run.seconds, 3), "calls": calls,
            "command": " ".join([os.path.relpath(run.command[0], ROOT)] + ["<prompt>" if a.startswith("REEF-TASK") else a
                                                                           for a in run.command[1:]])}


def translation_ms(largest: dict[str, tuple[str, dict]]) -> list[dict]:
    """In-process cost of translating each agent's largest request (as the provider got it on the direct route) to
    each other dialect, the provider's body built and serialized; median of 50."""
    from reef_lab.wire import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
    from reef_lab.wire.translate import Translation

    dialect_of = {"/v1/messages": ANTHROPIC, "/v1/chat/completions": OPENAI_CHAT, "/v1/responses": OPENAI_RESPONSES}
    out = []
    for agent, (path, body) in largest.items():
        client = dialect_of[path]
        for upstream in dialect_of.values():
            if upstream == client:
                continue
            times = []
            for _ in range(50):
                t0 = time.perf_counter()
                json.dumps(Translation(client, upstream, body).body)
                times.append((time.perf_counter() - t0) * 1e3)
            out.append({"agent": agent, "client": client, "upstream": upstream,
                        "body_kb": round(len(json.dumps(body)) / 1024, 1), "median_ms": round(statistics.median(times), 3)})
    return out


def summarize(runs: list[dict], agent: str) -> list[dict]:
    rows = []

    def calls(r: dict) -> list[dict]:
        return [c for c in r["calls"] if c["path"] in INFERENCE]
    base = [c["total_ms"] for r in runs if r["agent"] == agent and r["route"] == "direct" for c in calls(r)]
    for route in routes(agent):
        mine = [r for r in runs if r["agent"] == agent and r["route"] == route]
        totals = [c["total_ms"] for r in mine for c in calls(r)]
        firsts = [c["first_byte_ms"] for r in mine for c in calls(r)]
        if not totals:
            continue
        med, base_med = statistics.median(totals), statistics.median(base) if base else float("nan")
        rows.append({"agent": agent, "route": route, "runs": len(mine), "ok": sum(r["ok"] for r in mine),
                     "calls_per_run": round(len(totals) / len(mine), 2), "median_ms": round(med, 2),
                     "p90_ms": round(statistics.quantiles(totals, n=10)[-1], 2) if len(totals) > 1 else round(med, 2),
                     "first_byte_median_ms": round(statistics.median(firsts), 2),
                     "added_ms": round(med - base_med, 2), "ratio": round(med / base_med, 2),
                     "wall_median_s": round(statistics.median(r["wall_s"] for r in mine), 2)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="runs of each agent on each route")
    ap.add_argument("--agents", default="claude,codex,opencode")
    ap.add_argument("--out", default=str(ROOT / "results" / "agents"), help="<out>.md (its JSON: results/data/)")
    ap.add_argument("--summarize", action="store_true", help="run nothing: summarize the JSON's runs again")
    a = ap.parse_args()
    if a.summarize:
        data = json.loads(data_file(a.out).read_text())
        data["summary"] = [row for agent in data["meta"]["clients"] for row in summarize(data["runs"], agent)]
        data_file(a.out).write_text(json.dumps(data, indent=1))
        Path(a.out + ".md").write_text(render(data["meta"], data["summary"], data["runs"]))
        return
    agents = [x for x in a.agents.split(",") if installed(x)]
    if not agents:
        sys.exit("no agent installed: bash scripts/setup.sh --agents")
    runs: list[dict] = []
    largest: dict[str, tuple[str, dict]] = {}  # agent -> its largest request on the direct route
    load_before = [round(x, 2) for x in os.getloadavg()]
    tmp = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    with ScriptedProvider() as provider, contextlib.ExitStack() as stack:
        provider_port = int(provider.url.rsplit(":", 1)[1])
        servers = {None: stack.enter_context(ReefServer(provider.url, tmp / "data-same", free_port()))}
        servers.update({d: stack.enter_context(ReefServer(provider.url, tmp / f"data-{d}", free_port(), dialect=d))
                        for d in DIALECTS})
        for k in range(a.rounds):
            for agent in agents:
                order = routes(agent)
                order = order[k % len(order):] + order[:k % len(order)]  # each route leads in turn
                for route in order:
                    if route == "direct":
                        port = provider_port
                    else:
                        dialect = route.split("->")[1] if "->" in route else None
                        port = int(servers[dialect].url.rsplit(":", 1)[1])
                    tag = f"{agent}-{route.replace('->', '-to-')}-{k}"
                    seen = len(provider.requests)
                    r = one_run(agent, route, port, tmp / tag, tag)
                    if route == "direct":  # the agent's own requests, as it sent them
                        for req in provider.requests[seen:]:
                            size = len(json.dumps(req["body"])) if isinstance(req["body"], dict) else 0
                            if req["path"] in INFERENCE and size > len(json.dumps(largest.get(agent, ("", {}))[1])):
                                largest[agent] = (req["path"], req["body"])
                    runs.append(r)
                    print(f"[bench] {tag}: ok={r['ok']} calls={[round(c['total_ms'], 1) for c in r['calls']]}",
                          file=sys.stderr, flush=True)
        translation = translation_ms(largest)
    shutil.rmtree(tmp, ignore_errors=True)  # agents' homes, data dirs: hundreds of MB over a run
    rows = [row for agent in agents for row in summarize(runs, agent)]
    meta = {"command": command_line(), "rounds": a.rounds,
            "when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "python": platform.python_version(),
            "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
            "clients": {x: f"{AGENTS[x]}@{version(x)}" for x in agents},
            "serve": "scripts/serve.py --upstream-url <scripted provider> [--upstream-dialect D] (default workers)",
            "translation": translation}
    data_file(a.out).write_text(json.dumps({"meta": meta, "summary": rows, "runs": runs}, indent=1))
    Path(a.out + ".md").write_text(render(meta, rows, runs))
    print(render(meta, rows, runs))


def render(meta: dict, rows: list[dict], runs: list[dict]) -> str:
    lines = ["# Real agents through the relay: completion and added latency per call", "",
             f"`{meta['command']}` ({meta['when']}, {meta['cpus']} CPUs, Python {meta['python']}, load average "
             f"{meta['load_before'][0]} before and {meta['load_after'][0]} after: a machine shared with other work); "
             "raw numbers in [data/agents.json](data/agents.json).", "",
             "Clients (npm, installed by `bash scripts/setup.sh --agents`): " +
             ", ".join(f"`{v}`" for v in meta["clients"].values()) + ".", "",
             "Each run is one headless agent on the scripted task (turn 1: the provider answers with a file-writing "
             "tool call taken from the agent's own tools; turn 2: text), against the scripted provider "
             "(reef_lab/testing/scripted_provider.py) straight (`direct`, the baseline), through `scripts/serve.py` "
             "in the agent's own dialect (`relay`), or translated to another dialect (`relay->D`, "
             "`--upstream-dialect D`). A loopback proxy in front of the agent times every call from the request's "
             "first byte to the answer's last (inference calls only: Claude Code's `HEAD /` at start is left out); "
             "`added` is a route's median per call less the baseline's, `ratio` "
             "their quotient. `ok`: runs whose file was written with the right content and that ended with the "
             "provider's text. What a relayed call adds comes in two parts: before the first byte (reading the "
             "request, the scenario, translation, the call upstream) and after the provider's last event, when the "
             "relay writes the call's record durably (fsync) before it sends the final event that carries the "
             "receipt (docs/decisions.md, receipts only after fsync).", "",
             "| agent | route | ok | calls/run | median ms/call | p90 ms | first byte ms | added ms/call | ratio | "
             "agent wall s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['agent']} | {r['route']} | {r['ok']}/{r['runs']} | {r['calls_per_run']} | "
                     f"{r['median_ms']} | {r['p90_ms']} | {r['first_byte_median_ms']} | "
                     f"{'-' if r['route'] == 'direct' else r['added_ms']} | "
                     f"{'-' if r['route'] == 'direct' else r['ratio']} | {r['wall_median_s']} |")
    if meta.get("translation"):
        lines += ["", "Translating the largest request each agent sent (in process, the provider's body built and "
                  "serialized, median of 50):", "", "| agent | its dialect | to | body KB | ms |", "|---|---|---|---|---|"]
        lines += [f"| {t['agent']} | {t['client']} | {t['upstream']} | {t['body_kb']} | {t['median_ms']} |"
                  for t in meta["translation"]]
    commands = {r["agent"]: r["command"] for r in runs}
    lines += ["", "Commands (base URL, home and config folders set per run by reef_lab/testing/agents.py):", ""]
    lines += [f"- {agent}: `{cmd}`" for agent, cmd in commands.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
