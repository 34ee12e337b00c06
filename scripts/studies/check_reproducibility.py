"""Same seed, same run: each run below twice, the second beside a busy loop on one core, and their step losses and
release tensors compared bit for bit (results/reproducibility.md).

    .venv/bin/python scripts/studies/check_reproducibility.py              # both: an experiment and learn_tool_task's SFT stage
    .venv/bin/python scripts/studies/check_reproducibility.py --only sft   # one of them

- `experiment`: scripts/run_experiment.py recipes/sao/examples/arithmetic.yaml at seed 0 with a 64-rollout budget
  (2 critic warm-up steps, 2 policy steps, one candidate released on 32 held-out items; `deterministic`, the default: rounds of max_pool, one request at a time);
- `sft`: scripts/studies/learn_tool_task.py's SFT stage at seed 0 (64 calculator demonstration turns imported over HTTP,
  8 steps, one release) and its held-out calculator episodes.
Each run goes to runs/reproducibility/<name>-<a|b>; the page lists every step's loss of both runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from scripts.common import ROOT
from scripts.command_line import command_line, data_file

RUNS = Path("runs/reproducibility")

COMMANDS = {
    "experiment": lambda out: [sys.executable, "scripts/run_experiment.py", "recipes/sao/examples/arithmetic.yaml",
                               "--seed", "0", "--set", "rollouts=64", "--set", "recipe_config.eval_size=32",
                               "--set", "recipe_config.steps_per_candidate=2",
                               "--out", str(out)],
    "sft": lambda out: [sys.executable, "scripts/studies/learn_tool_task.py", "--seeds", "0", "--no-base", "--policy", "none",
                        "--tasks", "calculator", "--n", "10", "--data-dir", str(out / "data"), "--out",
                        str(out / "agents-learn")],
}


TIMES = {"time", "train_s", "step_s", "wall_s"}  # how long a step took is the one thing allowed to differ


def losses_and_weights(name: str, out: Path) -> tuple[list[float], dict[str, str], dict]:
    """The run's step losses (in order), a digest of each release's tensors, and what else it measured: every
    number of every step row (value losses, gradient norms, ...) and every eval, hashed, times left out."""
    import torch
    from safetensors.torch import load_file

    metrics = sorted((out / "data").glob("**/learn/*/metrics.jsonl"))
    rows = [json.loads(line) for line in metrics[0].read_text().splitlines()]
    digests = {}
    for folder in sorted((out / "data").glob("**/releases/*/v*")):
        h = hashlib.sha256()
        for f in sorted(folder.glob("*.safetensors")):
            for key, tensor in sorted(load_file(f).items()):
                h.update(key.encode())
                h.update(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        digests[folder.name] = h.hexdigest()[:16]
    numbers = [{k: v for k, v in r.items() if k not in TIMES} for r in rows if r["event"] in ("step", "eval")]
    other = {"step and eval rows": f"{len(numbers)}, sha256 "
                                   + hashlib.sha256(json.dumps(numbers, sort_keys=True).encode()).hexdigest()[:16]}
    if name == "sft":
        result = json.loads((out / "agents-learn.json").read_text())["runs"]["tools-sft-s0"]["eval"]["calculator"]
        other |= {"calculator": f"{result['success']}/{result['n']}",
                 "valid": f"{result['episodes_with_valid_calls']}/{result['n']}"}
    else:
        summary = json.loads((out / "summary.json").read_text())
        other |= {"final_accuracy": summary.get("final_accuracy"), "serving": summary.get("serving")}
    return [r["loss"] for r in rows if r["event"] == "step" and r.get("loss") is not None], digests, other


def run_twice(name: str) -> dict:
    outs, measured = [], []
    for k, tag in enumerate(("a", "b")):
        out = RUNS / f"{name}-{tag}"
        if out.exists():
            shutil.rmtree(out)
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if k == 1 else None
        started = time.perf_counter()
        try:
            print(f"[repro] {name}-{tag}: {' '.join(COMMANDS[name](out)[1:])}", file=sys.stderr, flush=True)
            subprocess.run(COMMANDS[name](out), cwd=ROOT, check=True)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        outs.append(out)
        measured.append((*losses_and_weights(name, ROOT / out), round(time.perf_counter() - started)))
    (la, wa, oa, ta), (lb, wb, ob, tb) = measured
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    return {"name": name, "commit": commit.strip(), "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": command_line(COMMANDS[name](RUNS / f"{name}-a")[1:]),
            "losses": [la, lb], "weights": [wa, wb], "other": [oa, ob], "wall_s": [ta, tb],
            "identical": la == lb and wa == wb and oa == ob}


def merged(results: list[dict], path: Path) -> list[dict]:
    """With --only, the page keeps the other runs' sections from its JSON (each says its own command and commit)."""
    ran = {r["name"] for r in results}
    kept = json.loads(data_file(path).read_text()) if data_file(path).exists() else []
    return sorted([r for r in kept if r["name"] not in ran] + results, key=lambda r: r["name"])


def write(results: list[dict], path: Path) -> None:
    data_file(path).write_text(json.dumps(results, indent=1))
    lines = ["# Same seed, same run", "",
             "Command: `python scripts/studies/check_reproducibility.py` (or `--only NAME` for one section; each run twice, "
             "the second beside a busy loop spinning on one of the two cores).", ""]
    for r in results:
        lines += [f"## {r['name']}: {'identical' if r['identical'] else 'DIFFERENT'}", "",
                  f"Run: `{r['command']}` (and the same into `-b`), at commit {r['commit']}, written {r['written']}.",
                  "",
                  "| step | loss, run a | loss, run b |", "|---|---|---|"]
        lines += [f"| {i + 1} | {a!r} | {b!r} |" for i, (a, b) in enumerate(zip(*r["losses"], strict=False))]
        lines += ["", "| | run a | run b |", "|---|---|---|",
                  f"| release tensors (sha256 of every tensor, first 16 hex) | {r['weights'][0]} | {r['weights'][1]} |",
                  f"| measured | {r['other'][0]} | {r['other'][1]} |",
                  f"| wall s | {r['wall_s'][0]} | {r['wall_s'][1]} |", ""]
    path.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(COMMANDS), default=None)
    ap.add_argument("--results", default="results/reproducibility.md")
    args = ap.parse_args()
    results = [run_twice(name) for name in ([args.only] if args.only else sorted(COMMANDS))]
    write(merged(results, ROOT / args.results), ROOT / args.results)
    for r in results:
        print(f"[repro] {r['name']}: {'identical' if r['identical'] else 'DIFFERENT'} losses and release tensors",
              file=sys.stderr)


if __name__ == "__main__":
    main()
