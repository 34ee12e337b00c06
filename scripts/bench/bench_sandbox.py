"""Cost of the TTT sandbox's isolation: bubblewrap (`isolation="bwrap"`) against a plain child process
(`isolation="none"`, the sandbox before bubblewrap), same programs, same limits, interleaved.

    .venv/bin/python scripts/bench/bench_sandbox.py     # results/sandbox-overhead.md, data/sandbox-overhead.json
    .venv/bin/python scripts/bench/bench_sandbox.py --runs 60

Per run: the wall time of `run_python` (temporary folder, process start, the program, its verdict). Programs: the
circle-packing initial state (what a TTT-Discover rollout runs), `pass`, and one that imports numpy. Each round runs
every program once under each isolation, the order alternating per round; medians and the ratio bwrap / none.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from recipes.tttd.problems import CirclePacking
from recipes.tttd.sandbox import SandboxLimits, check_isolation, run_python
from scripts.common import ROOT
from scripts.command_line import command_line, data_file

PROGRAMS = {"circle program (n=6)": CirclePacking(6).initial_solution(), "pass": "pass",
            "import numpy": "import numpy\nprint(numpy.zeros(3).sum())"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="rounds (each runs every program under both isolations)")
    ap.add_argument("--out", default=str(ROOT / "results" / "sandbox-overhead"))
    args = ap.parse_args()
    limits = {iso: SandboxLimits(cpu_seconds=5, wall_seconds=30.0, memory_mb=256, output_bytes=16 * 1024, isolation=iso)
              for iso in ("none", "bwrap")}
    check_isolation(limits["bwrap"])
    times = {name: {iso: [] for iso in limits} for name in PROGRAMS}
    for k in range(args.runs + 1):  # round 0 warms the page cache; not counted
        for name, code in PROGRAMS.items():
            for iso in (("none", "bwrap") if k % 2 else ("bwrap", "none")):
                t = time.perf_counter()
                r = run_python(code, limits[iso])
                dt = time.perf_counter() - t
                assert r.ok, (name, iso, r)
                if k:
                    times[name][iso].append(dt)
    rows = []
    for name, by in times.items():
        none, bwrap = statistics.median(by["none"]), statistics.median(by["bwrap"])
        rows.append({"program": name, "none_ms": round(none * 1000, 1), "bwrap_ms": round(bwrap * 1000, 1),
                     "overhead_ms": round((bwrap - none) * 1000, 1), "ratio": round(bwrap / none, 3),
                     "runs": len(by["none"])})
    meta = {"command": command_line(), "machine": platform.platform(),
            "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d")}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data_file(out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = ["# TTT sandbox: bubblewrap vs a plain child process", "",
             f"`{meta['command'].strip()}` ({meta['date']}, {meta['machine']}, Python {meta['python']}; a shared "
             "2-CPU machine). Median wall time of one `run_python` call over the rounds, both isolations "
             "interleaved.", "", "| program | none (ms) | bwrap (ms) | overhead (ms) | bwrap / none |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['program']} | {r['none_ms']} | {r['bwrap_ms']} | {r['overhead_ms']} | {r['ratio']} |"
              for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
