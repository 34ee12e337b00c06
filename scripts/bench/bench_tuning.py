"""Server tuning on vs off, side by side: is pinning workers to CPUs and asking for a short scheduler slice worth
being a default?

    .venv/bin/python scripts/bench/bench_tuning.py   # results/server-tuning.{md,png}, data/server-tuning.json

Starts the instant stub provider and three real `scripts/serve.py --upstream-url <stub> --workers 2` servers at once,
identical but for server/tuning.py: `plain` (`--pin-workers 0 --sched-slice-us 0`), `pinned` (`--pin-workers 1`) and
`tuned` (`--pin-workers 1 --sched-slice-us 100`, the slice governor on). Each round measures all three, each first in
turn (a noisy moment then hits all): throughput with `wrk -c16` (needs `apt-get install wrk`), then latency of 16
paced clients at `--rate` requests/s (threads of a separate process, as scripts/bench/bench_gateway.py does). The answer
is each arm's per-round ratio to plain, its median and spread, and the machine's busy share and CPU steal during the
run (a busy machine is what the governor reacts to).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from reef_lab.testing.processes import start_server, start_stub
from scripts.bench.bench_gateway import WRK_CHAT, ms, need_wrk, paced, wrk
from scripts.common import ROOT, RunInfo, pyplot
from scripts.command_line import command_line, data_file
from server.tuning import machine_busy

SETTINGS = {"plain": ["--pin-workers", "0", "--sched-slice-us", "0"],
            "pinned": ["--pin-workers", "1", "--sched-slice-us", "0"],
            "tuned": ["--pin-workers", "1", "--sched-slice-us", "100"]}
ARMS = [name for name in SETTINGS if name != "plain"]  # each compared with plain


def measure(args) -> dict:
    stub = start_stub()
    servers = {}
    rounds = []
    try:
        for name, flags in SETTINGS.items():
            data_dir = tempfile.mkdtemp(prefix=f"reef-tuning-{name}-")
            proc = start_server("--workers", "2", "--upstream-url", stub.url, "--log-level", "warning", *flags,
                                data_dir=data_dir, log=Path(data_dir + "-serve.log"))
            servers[name] = (proc.port, data_dir, proc)
            paced(proc.port, 16, args.rate, 2)  # warm-up
        _, ticks = machine_busy()
        for r in range(args.rounds):
            names = list(servers)
            order = names[r % len(names):] + names[:r % len(names)]  # each server first in turn
            row = {"order": order}
            for name in order:
                port = servers[name][0]
                print(f"[tuning] round {r + 1}/{args.rounds}: {name} throughput", flush=True)
                _, ticks = machine_busy(ticks)
                thr = wrk(f"http://127.0.0.1:{port}/v1/chat/completions", WRK_CHAT, args.seconds)
                busy, ticks = machine_busy(ticks)
                print(f"[tuning] round {r + 1}/{args.rounds}: {name} latency", flush=True)
                lat, errors = paced(port, 16, args.rate, args.seconds)
                row[name] = {"rps": thr["rps"], "errors": thr["non_2xx"] + errors, "busy_share": busy,
                             **{f"p{p}_ms": round(ms(lat, p), 3) for p in (50, 90, 99)}}
            for arm in ARMS:
                row[arm]["rps_ratio"] = round(row[arm]["rps"] / row["plain"]["rps"], 4)
                row[arm]["p50_ratio"] = round(row[arm]["p50_ms"] / row["plain"]["p50_ms"], 4)
                row[arm]["p99_ratio"] = round(row[arm]["p99_ms"] / row["plain"]["p99_ms"], 4)
            rounds.append(row)
    finally:
        for child in [proc for _, _, proc in servers.values()] + [stub]:
            child.stop(60)
        for _, d, _ in servers.values():
            shutil.rmtree(d, ignore_errors=True)
            Path(d + "-serve.log").unlink(missing_ok=True)
    return {"rounds": rounds, "summary": summarize(rounds)}


def summarize(rounds: list[dict]) -> dict:
    def spread(arm: str, key: str) -> dict:
        xs = [r[arm][key] for r in rounds]
        return {"median": round(statistics.median(xs), 4), "min": min(xs), "max": max(xs),
                "rounds_better": sum(x > 1 for x in xs) if key == "rps_ratio" else sum(x < 1 for x in xs)}
    out = {"ratios": {arm: {k: spread(arm, k) for k in ("rps_ratio", "p50_ratio", "p99_ratio")} for arm in ARMS}}
    for name in SETTINGS:
        out[name] = {k: round(statistics.median(r[name][k] for r in rounds), 3)
                     for k in ("rps", "p50_ms", "p90_ms", "p99_ms")}
        out[name]["errors"] = sum(r[name]["errors"] for r in rounds)
    out["busy_share_median"] = round(statistics.median(
        r[n]["busy_share"] for r in rounds for n in SETTINGS if r[n]["busy_share"] is not None), 3)
    return out


def render(result: dict, args) -> str:
    s = result["summary"]
    lines = [
        "# Server tuning on vs off (scripts/bench/bench_tuning.py)", "",
        f"Command: `{result['command']}` (started {result['started']}; {result['machine']['cpus']} CPUs, "
        f"{result['machine']['cpu']}; CPU steal {result['cpu_steal_share']:.1%} of the run; the machine was "
        f"{s['busy_share_median']:.0%} busy (median over the throughput phases), other work included).", "",
        f"{len(SETTINGS)} servers at once, `scripts/serve.py --upstream-url <instant stub> --workers 2`, identical but "
        "for server/tuning.py: " + "; ".join(f"**{n}** `{' '.join(f)}`" for n, f in SETTINGS.items())
        + " (`--sched-slice-us 100`: the slice governor on). Each round: `wrk -c16` throughput, then 16 paced "
        f"clients at {args.rate:g} requests/s for latency; {args.seconds} s per phase, each server first in turn.",
        "",
        "| | requests/s (median) | p50 ms | p90 ms | p99 ms | errors |", "|---|---|---|---|---|---|",
        *[f"| {n} | {s[n]['rps']:,.0f} | {s[n]['p50_ms']} | {s[n]['p90_ms']} | {s[n]['p99_ms']} | {s[n]['errors']} |"
          for n in SETTINGS], "",
        "Each against plain, per round (paired in time):", "",
        "| arm | measure | median ratio | min | max | rounds where the arm is better |", "|---|---|---|---|---|---|",
        *[f"| {arm} | {label} | {s['ratios'][arm][k]['median']} | {s['ratios'][arm][k]['min']} | "
          f"{s['ratios'][arm][k]['max']} | {s['ratios'][arm][k]['rounds_better']} of {len(result['rounds'])} |"
          for arm in ARMS
          for k, label in (("rps_ratio", "throughput"), ("p50_ratio", "p50 latency"), ("p99_ratio", "p99 latency"))],
        "", "Rounds (requests/s; p50 / p99 ms):", "",
        "| round | order | " + " | ".join(SETTINGS) + " |", "|---|---|" + "---|" * len(SETTINGS),
        *[f"| {i + 1} | {', '.join(r['order'])} | " + " | ".join(
            f"{r[n]['rps']:,.0f}; {r[n]['p50_ms']} / {r[n]['p99_ms']}" for n in SETTINGS) + " |"
          for i, r in enumerate(result["rounds"])], ""]
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    xs = range(1, len(result["rounds"]) + 1)
    for name, color in zip(SETTINGS, ("#888", "#27a", "#2a7")):
        axes[0].plot(xs, [r[name]["rps"] for r in result["rounds"]], "o-", color=color, label=name)
        axes[1].plot(xs, [r[name]["p99_ms"] for r in result["rounds"]], "o-", color=color, label=name)
    axes[0].set_title("throughput (wrk -c16), requests/s")
    axes[1].set_title("p99 latency of paced clients, ms")
    for ax in axes:
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6, help="rounds, each measuring both servers")
    ap.add_argument("--seconds", type=int, default=8, help="length of each phase")
    ap.add_argument("--rate", type=float, default=400, help="total paced request rate of the latency phase")
    ap.add_argument("--out", default=str(ROOT / "results" / "server-tuning"), help="results path prefix")
    args = ap.parse_args()
    need_wrk()
    run = RunInfo()
    result = measure(args)
    result.update({**run.fields(), "command": command_line()})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    data_file(args.out).write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out + ".md").write_text(render(result, args))
    plot(result, args.out + ".png")
    print(render(result, args))


if __name__ == "__main__":
    main()
