"""Report to live: how long from the report that completes a training batch to the first answer served by the
release trained on it, and where that time goes, against the training compute itself (issue 39 item 5).

    .venv/bin/python scripts/bench/bench_report_to_live.py                             # sft, sao, grpo x embedded, vllm
    .venv/bin/python scripts/bench/bench_report_to_live.py --recipes sft --engines embedded --repeats 1

Per (recipe, engine, repeat): a fresh `scripts/serve.py --recipe R` (auto mode, one batch of 8 makes one candidate,
selection always, a 16-item held-out arithmetic evaluation and the default retention task), LoRA rank 8 on both
engines (what vLLM's in-place reload takes); a client asks 8 arithmetic questions (GRPO: 2 prompts x 4) through the
OpenAI SDK and reports each; the last report starts the clock, and the client asks again until an answer comes from
release v1 (`x-reef-release-id`). The learner's own metrics rows (their wall times) split the wait into: queue (the
report to the step's start: the learner waking, draining its queue and, on its first round, loading the trainer),
train (the step), candidate (export, held-out and retention evaluation, selection), release (load, route) and first
answer (the release serving to the client's first answer from it).
Writes results/report-to-live.{md,png} and results/data/report-to-live.json (or --out). Runs alternate engines
within a repeat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import openai
import requests

from reef_lab import procs
from reef_lab.tasks.base import make_task
from reef_lab.testing import free_port
from scripts.common import ROOT, pyplot, wait_answering
from scripts.command_line import command_line, data_file

SCENARIO = "r2l"
PHASES = ("queue", "train", "candidate", "release", "first_answer")


def recipe_config(recipe: str) -> dict:
    base = {"mode": "auto", "steps_per_candidate": 1, "selection": "always", "eval_size": 16, "eval_max_tokens": 16,
            "eval_task": {"name": "arithmetic"}, "trainer": {"lr": 2.0e-4, "lora_rank": 8, "micro_batch_size": 8}}
    extra = {"sft": {"batch_size": 8, "score_threshold": 0.0},
             "sao": {"batch_size": 8, "critic_warmup_steps": 0, "critic_updates": 1},
             "grpo": {"batch_size": 8, "group_size": 4}}[recipe]
    return {**base, **extra}


def serve_cmd(recipe: str, engine: str, port: int, data_dir: Path, model_path: str | None) -> list[str]:
    cmd = [sys.executable, "scripts/serve.py", "--engine", engine, "--port", str(port), "--data-dir", str(data_dir),
           "--recipe", recipe, "--recipe-config", json.dumps(recipe_config(recipe)), "--log-level", "warning"]
    return cmd + (["--model-path", model_path] if model_path else [])


def one(recipe: str, engine: str, k: int, work: Path, model_path: str | None, timeout: float) -> dict:
    folder = work / f"{recipe}-{engine}-{k}"
    folder.mkdir(parents=True)
    port, data_dir, log = free_port(), folder / "data", folder / "serve.log"
    url = f"http://127.0.0.1:{port}"
    cmd = serve_cmd(recipe, engine, port, data_dir, model_path)
    server = procs.Popen(cmd, cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=1800, max_retries=0)
    try:
        wait_answering(url, server, log)
        group = 4 if recipe == "grpo" else 1
        items = make_task({"name": "arithmetic"}).items(8 // group, seed=100 + k)
        task = make_task({"name": "arithmetic"})
        receipts = []
        for i in range(8):
            item = items[i // group]
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=item["messages"], max_tokens=16, temperature=1.0, seed=i,
                extra_headers={"x-reef-scenario": SCENARIO, "x-reef-tag-group": f"p{i // group}"})
            receipts.append((raw.headers["x-reef-agent-record-id"],
                             task.score(item, raw.parse().choices[0].message.content or "")))
        for rid, score in receipts:
            t_report = time.time()
            requests.post(url + "/reef/report", json={"score": score, "references": [rid]},
                          headers={"x-reef-scenario": SCENARIO}, timeout=60).raise_for_status()
        served, t_live, asked = None, None, 0
        while time.time() - t_report < timeout:
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "What is 2 + 2?"}], max_tokens=2,
                extra_headers={"x-reef-scenario": SCENARIO})
            asked += 1
            served = raw.headers.get("x-reef-release-id")
            if served == f"{SCENARIO}:v1":
                t_live = time.time()
                break
            time.sleep(0.2)
        rows = [json.loads(x) for x in (data_dir / "learn" / SCENARIO / "metrics.jsonl").read_text().splitlines()]
    finally:
        server.stop(120)
    if t_live is None:
        raise RuntimeError(f"{folder.name}: no answer from v1 within {timeout:.0f} s (last {served}); {log}")
    step = next(r for r in rows if r["event"] == "step" and r.get("policy_step"))
    cand = next(r for r in rows if r["event"] == "candidate")
    release = next(r for r in rows if r["event"] == "release")
    step_start = step["time"] - step["train_s"]
    phases = {"queue": step_start - t_report, "train": step["train_s"], "candidate": cand["time"] - step["time"],
              "release": release["time"] - cand["time"], "first_answer": t_live - release["time"]}
    total = t_live - t_report
    return {"recipe": recipe, "engine": engine, "repeat": k, "command": command_line(cmd[1:]), "report_to_live_s":
            round(total, 2), "phases_s": {p: round(v, 2) for p, v in phases.items()},
            "train_share": round(phases["train"] / total, 3), "swap_s": release.get("swap_s"), "polls": asked}


def write(rows: list[dict], out: Path, argv: list[str]) -> None:
    command = command_line(argv)
    out.parent.mkdir(parents=True, exist_ok=True)
    data_file(out).write_text(json.dumps({"command": command, "runs": rows}, indent=1))
    cells: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        cells.setdefault((r["recipe"], r["engine"]), []).append(r)
    lines = ["# Report to live", "", f"Command: `{command}` (written "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; 2 CPUs shared with other work).", "",
             "From the report that completes a batch of 8 to the first answer served by the release trained on it "
             "(medians over repeats, seconds); the phases come from the learner's own metrics rows.", "",
             "| recipe | engine | runs | report to live | queue | train | candidate (export, eval, retention) | "
             "release | first answer | train share |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (recipe, engine), rs in sorted(cells.items()):
        med = {p: statistics.median(r["phases_s"][p] for r in rs) for p in PHASES}
        total = statistics.median(r["report_to_live_s"] for r in rs)
        lines.append(f"| {recipe} | {engine} | {len(rs)} | {total:.1f} | " + " | ".join(f"{med[p]:.1f}" for p in PHASES)
                     + f" | {statistics.median(r['train_share'] for r in rs):.0%} |")
    lines += ["", "Every run:", "", "| recipe | engine | repeat | report to live s | " + " | ".join(PHASES) + " |",
              "|---|---|---|---|" + "---|" * len(PHASES)]
    lines += [f"| {r['recipe']} | {r['engine']} | {r['repeat']} | {r['report_to_live_s']} | "
              + " | ".join(str(r["phases_s"][p]) for p in PHASES) + " |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    try:
        plt = pyplot()
    except ImportError:
        return
    keys = sorted(cells)
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(keys) + 1.5))
    left = [0.0] * len(keys)
    for p in PHASES:
        vals = [statistics.median(r["phases_s"][p] for r in cells[key]) for key in keys]
        ax.barh(range(len(keys)), vals, left=left, label=p)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(range(len(keys)), [f"{r} / {e}" for r, e in keys])
    ax.set_xlabel("seconds from the completing report (median over repeats)")
    ax.legend(fontsize=7, ncols=len(PHASES), loc="upper center", bbox_to_anchor=(0.5, -0.18))
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=["sft", "sao", "grpo"], choices=["sft", "sao", "grpo"])
    ap.add_argument("--engines", nargs="+", default=["embedded", "vllm"], choices=["embedded", "vllm"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model-path", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the release to answer")
    ap.add_argument("--work", default="runs/report-to-live", help="the runs' data dirs and logs")
    ap.add_argument("--out", default="results/report-to-live")
    args = ap.parse_args()
    work = ROOT / args.work / time.strftime("%Y%m%d-%H%M%S")
    rows = []
    for k in range(args.repeats):
        for recipe in args.recipes:
            for engine in (args.engines if k % 2 == 0 else list(reversed(args.engines))):
                rows.append(one(recipe, engine, k, work, args.model_path, args.timeout))
                print(f"[r2l] {recipe}/{engine}#{k}: {rows[-1]['report_to_live_s']} s "
                      f"({rows[-1]['phases_s']})", file=sys.stderr, flush=True)
                write(rows, ROOT / args.out, sys.argv)


if __name__ == "__main__":
    main()
