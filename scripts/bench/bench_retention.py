"""What retention costs under load: scripts/bench/soak.py with retention off and on, alternated, on one machine.

    .venv/bin/python scripts/bench/bench_retention.py          # results/retention.{md,png}, data/retention.json
    .venv/bin/python scripts/bench/bench_retention.py --pairs 1 --minutes 1 --out runs/ret   # a quick look

Each run is a fresh soak (stub provider, scripts/serve.py with a primary and a relay worker, `--clients` keep-alive
clients asking for `--rate` requests/s in all: more than this machine carries, so the rate reached is the
throughput) with `--roll-records` records per segment both ways, so both roll as often; "on" adds the limits in
`--on` (by default a records limit that the load passes within the first minute, so every later roll is followed
by an eviction). Pairs run off then on, on then off, ... and each pair gives a ratio on/off of requests per second
and of the chat and report p50/p99, so a drift of the shared machine's load hits both sides alike. Reads during the
load ask for one of the client's recent receipts both ways (older ones may be evicted with retention on, and a read
from a segment costs more than one from a log, so both sides must read alike).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.common import ROOT, pyplot
from scripts.command_line import command_line, data_file, repo_path


def run(args, on: bool, out: Path) -> dict:
    cmd = [sys.executable, "scripts/bench/soak.py", "--warmup-minutes", "0", "--minutes", str(args.minutes), "--rate",
           str(args.rate), "--clients", str(args.clients), "--reads", "50", "--roll-records", str(args.roll_records),
           "--recent-reads", "--out", str(out), *(shlex.split(args.on) if on else [])]
    t0, load = time.time(), os.getloadavg()[0]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    r = json.loads(data_file(out / "soak").read_text())
    measured = [m for m in r["by_minute"] if not m["warmup"]]
    seconds = args.minutes * 60
    sizes = r["sizes"]
    return {"retention": on, "command": " ".join(cmd[1:]), "wall_s": round(time.time() - t0, 1),
            "load_average_before": round(load, 2),
            "requests": r["requests"], "errors": r["errors"], "requests_per_s": round(r["requests"] / seconds, 1),
            "chat": r["by_kind"]["chat"], "report": r["by_kind"]["report"], "read": r["by_kind"]["read"],
            "p99_per_minute_ms": [m["p99_ms"] for m in measured],
            "final_records_bytes": sizes[-1][1]["total"] if sizes else None,
            "max_records_bytes": max((s["total"] for _, s in sizes), default=None),
            "sizes": [(t, s["total"]) for t, s in sizes],
            "evicted": (r.get("retention") or {}).get("evicted"),
            "server_cpu_s": r["server_cpu_s"], "cpu_ms_per_request": round(r["server_cpu_s"] * 1e3 / r["requests"], 4),
            "retention_cpu_s": (r.get("retention") or {}).get("retention_cpu_s"),
            "missing": (r.get("retention") or {}).get("n_missing")}


def ratio(on: dict, off: dict, get) -> float:
    return round(get(on) / get(off), 3)


METRICS = {"requests/s": lambda r: r["requests_per_s"], "server CPU per request": lambda r: r["cpu_ms_per_request"],
           "chat p50": lambda r: r["chat"]["p50_ms"],
           "chat p99": lambda r: r["chat"]["p99_ms"], "report p50": lambda r: r["report"]["p50_ms"],
           "report p99": lambda r: r["report"]["p99_ms"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="off/on pairs")
    ap.add_argument("--minutes", type=float, default=2.0, help="minutes of load per run")
    ap.add_argument("--rate", type=float, default=3000.0, help="requests/s asked for (more than the machine carries)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--roll-records", type=int, default=5000)
    ap.add_argument("--on", default="--retain-max-records 20000 --retain-max-age 1h",
                    help="soak.py's retention flags for the 'on' runs")
    ap.add_argument("--out", default=str(ROOT / "results"))
    ap.add_argument("--render-only", action="store_true", help="only redraw retention.md/.png from its JSON")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.render_only:
        report = json.loads(data_file(out / "retention").read_text())
        (out / "retention.md").write_text(render(report))
        plot(report, out / "retention.png")
        return
    runs = []
    with tempfile.TemporaryDirectory(prefix="reef-bench-retention-") as tmp:
        for i in range(args.pairs):
            pair = {}
            for on in ((False, True) if i % 2 == 0 else (True, False)):  # off first, then on first, ...
                r = pair[on] = run(args, on, Path(tmp) / f"{i}-{'on' if on else 'off'}")
                print(f"[bench] pair {i + 1} {'on ' if on else 'off'}: {r['requests_per_s']} requests/s, chat p50 "
                      f"{r['chat']['p50_ms']} ms p99 {r['chat']['p99_ms']} ms, records {r['final_records_bytes']:,} "
                      f"bytes, evicted {r['evicted']}", file=sys.stderr, flush=True)
            runs += [pair[False], pair[True]]
    pairs = [(runs[2 * i + 1], runs[2 * i]) for i in range(args.pairs)]
    ratios = {k: [ratio(on, off, get) for on, off in pairs] for k, get in METRICS.items()}
    summary = {k: {"mean": round(statistics.mean(v), 3), "min": min(v), "max": max(v)} for k, v in ratios.items()}
    report = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": command_line(program=""), "args": vars(args) | {"out": repo_path(args.out)},
              "ratios_on_over_off": ratios, "summary": summary, "runs": runs}
    data_file(out / "retention").write_text(json.dumps(report, indent=1))
    (out / "retention.md").write_text(render(report))
    plot(report, out / "retention.png")
    print(render(report))


def render(r: dict) -> str:
    a = r["args"]
    lines = [f"# Retention on and off under the soak's load ({r['started']})", "",
             f"Command: `.venv/bin/python {r['command'].strip()}` (plot: retention.png). {a['pairs']} pairs of "
             f"{a['minutes']:g}-minute runs of `scripts/bench/soak.py`, retention off and on, each on a fresh data dir: "
             f"{a['clients']} clients asking for {a['rate']:g} requests/s in all (more than the machine carries: "
             f"what it reaches is the throughput), {a['roll_records']:,} records per segment both ways; on: "
             f"`{a['on']}`. Pairs alternate which side runs first. A cycle is a chat completion (every fourth "
             "streamed) and a report on it; every tenth also reads one of the client's 20 newest records. The "
             "machine is a shared 2-CPU box: its load average before each run is in the table; the server's "
             "CPU per request (its workers' CPU seconds over the load, per request) depends less on that load "
             "than requests/s does, and retention's own CPU time (its rounds' thread time) is in the last "
             "column.", "",
             "## Ratios on/off, per pair", "", "| metric | " + " | ".join(f"pair {i + 1}" for i in
                                                                          range(a["pairs"])) + " | mean |",
             "|---|" + "---|" * (a["pairs"] + 1)]
    for k, v in r["ratios_on_over_off"].items():
        lines.append(f"| {k} | " + " | ".join(f"{x:.3f}" for x in v) + f" | **{r['summary'][k]['mean']:.3f}** |")
    lines += ["", "## Runs", "",
              "| run | load avg | requests/s | server CPU per request | errors | chat p50 / p99 | report p50 / p99 | "
              "records folder at the end (max) | evicted (retention's CPU) |", "|---|---|---|---|---|---|---|---|---|"]
    for i, run_ in enumerate(r["runs"]):
        ev = run_["evicted"]
        lines.append(f"| {i // 2 + 1} {'on' if run_['retention'] else 'off'} | {run_['load_average_before']} | "
                     f"{run_['requests_per_s']} | {run_['cpu_ms_per_request']} ms | "
                     f"{run_['errors']} | {run_['chat']['p50_ms']} / {run_['chat']['p99_ms']} ms | "
                     f"{run_['report']['p50_ms']} / {run_['report']['p99_ms']} ms | "
                     f"{run_['final_records_bytes'] / 2**20:.1f} MB ({run_['max_records_bytes'] / 2**20:.1f} MB) | "
                     + (f"{ev['segments']} segments, {ev['records']:,} records, {run_['missing']} missing "
                        f"({run_['retention_cpu_s']} of {run_['server_cpu_s']} CPU s)" if ev else "-") + " |")
    off = [x for x in r["runs"] if not x["retention"]]
    on = [x for x in r["runs"] if x["retention"]]
    rps = r["ratios_on_over_off"]["requests/s"]
    spread = max(max(x["requests_per_s"] for x in side) / min(x["requests_per_s"] for x in side) for side in (off, on))
    loads = [x["load_average_before"] for x in r["runs"]]
    share = [x["retention_cpu_s"] / x["server_cpu_s"] for x in on]
    lines += ["", "## Reading", "",
              f"Throughput with retention on was {statistics.mean(rps):.3f} of off (pairs {min(rps):.3f} to "
              f"{max(rps):.3f}), while runs of the same side differed by up to {spread:.2f}x (the machine's load "
              f"average was {min(loads):g} to {max(loads):g} on 2 CPUs): within the noise here, though with "
              f"{len(rps)} pairs a cost of a few percent cannot be ruled out. Retention's rounds took "
              f"{min(share):.1%} to {max(share):.1%} of the workers' CPU time. With it on, the records folder held "
              f"at most {max(x['max_records_bytes'] for x in on) / 2**20:.1f} MB, against "
              f"{max(x['final_records_bytes'] for x in off) / 2**20:.1f} MB and growing without it, and no record "
              f"the policy keeps was missing ({sum(x['missing'] or 0 for x in on)} in all; soak.py checks the "
              "newest `max_records` and those younger than `max_age`).", ""]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for i, run_ in enumerate(r["runs"]):
        on = run_["retention"]
        a.plot([t / 60 for t, _ in run_["sizes"]], [s / 2**20 for _, s in run_["sizes"]],
               color="tab:green" if on else "tab:grey", alpha=0.8,
               label=("on" if on else "off") if i < 2 else None)
    a.set(xlabel="minutes", ylabel="records folder (segments + logs), MB", title="size under load")
    a.legend()
    names = list(r["ratios_on_over_off"])
    b.bar([k.replace("server CPU per request", "CPU/request") for k in names],
          [r["summary"][k]["mean"] for k in names], color="tab:green")
    for i, k in enumerate(names):
        b.plot([i] * len(r["ratios_on_over_off"][k]), r["ratios_on_over_off"][k], "k.")
    b.axhline(1.0, color="grey", ls=":")
    b.set(ylabel="on / off", title="retention on / off (bars: mean, dots: pairs)")
    b.tick_params(axis="x", rotation=25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
