"""Training beside the engine (issue 28): the live SAO command, `serve.py --recipe sao` with SDK clients asking
arithmetic questions and reporting verifier scores (scripts/live_client.py), once per engine, interleaved; it
measures (a) the training step time (the whole round, critic and policy, and the policy step alone) beside each
engine under the same client load and (b) the time from the first client request to the first release.

    .venv/bin/python scripts/bench_train_beside_engine.py                    # embedded and vllm, 2 rounds each
    .venv/bin/python scripts/bench_train_beside_engine.py --arms embedded,vllm,vllm-nopause --repeats 1

Arms: `embedded` (the model in serve.py's process), `vllm` (the vLLM server, paused during each training step:
VLLMEngine.training_step) and `vllm-nopause` (the same, `pause_for_training: false`: how it ran before). All arms
run the same recipe config: recipes/sao/examples/live.yaml with LoRA (rank 8, lr 2e-4), which vLLM's weight reload
needs. The machine is shared, so arms alternate (embedded, vllm, embedded, vllm, ...) and the results are ratios
per round. Writes results/train-beside-vllm.{json,md,png} (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402
import yaml  # noqa: E402

from reef_lab import procs  # noqa: E402
from reef_lab.testing import free_port  # noqa: E402

SCENARIO = "arithmetic-live"  # live_client.py's default
ARMS = {"embedded": ("embedded", None), "vllm": ("vllm", True), "vllm-nopause": ("vllm", False)}


def recipe_config(folder: Path) -> Path:
    cfg = yaml.safe_load((ROOT / "recipes/sao/examples/live.yaml").read_text())
    cfg["trainer"] = {**cfg.get("trainer", {}), "lora_rank": 8, "lr": 2.0e-4}
    path = folder / "sao-live-lora.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def serve_cmd(arm: str, port: int, data_dir: Path, cfg: Path) -> list[str]:
    engine, pause = ARMS[arm]
    cmd = [sys.executable, "scripts/serve.py", "--engine", engine, "--port", str(port), "--data-dir", str(data_dir),
           "--recipe", "sao", "--recipe-config", str(cfg), "--log-level", "warning"]
    if pause is not None:
        cmd += ["--engine-options", json.dumps({"port": free_port(), "pause_for_training": pause})]
    return cmd


def wait_answering(url: str, server: procs.Popen, log: Path, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"serve.py exited with {server.returncode}: {log.read_text()[-3000:]}")
        try:
            r = requests.post(url + "/v1/chat/completions", json=body, headers={"x-reef-scenario": "warmup"},
                              timeout=600)
            if r.status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(2)
    raise RuntimeError(f"serve.py did not answer within {timeout:.0f} s")


def metrics(data_dir: Path) -> list[dict]:
    path = data_dir / "learn" / SCENARIO / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def inference_records(data_dir: Path) -> dict:
    """Answers of the live scenario: how many, how many failed, and their latency (ms)."""
    import polars as pl

    from reef_lab.records.store import scan_records

    df = scan_records(data_dir).filter((pl.col("scenario") == SCENARIO) & (pl.col("kind") == "inference")) \
        .select("status", "timing").collect()
    ms = sorted(json.loads(t or "{}").get("total_ms", 0.0) for t in df["timing"].to_list())
    pct = (lambda q: round(ms[min(len(ms) - 1, int(q * len(ms)))] / 1e3, 2)) if ms else (lambda q: None)
    return {"answers": df.height, "failed": int((df["status"] != "ok").sum()), "latency_p50_s": pct(0.5),
            "latency_p95_s": pct(0.95), "latency_max_s": round(ms[-1] / 1e3, 2) if ms else None}


def run_arm(arm: str, k: int, out: Path, cfg: Path, clients: int, rollouts: int, timeout: float) -> dict:
    folder = out / f"{arm}-{k}"
    folder.mkdir(parents=True)
    port, data_dir = free_port(), folder / "data"
    url = f"http://127.0.0.1:{port}"
    cmd = serve_cmd(arm, port, data_dir, cfg)
    log = folder / "serve.log"
    started = time.time()
    server = procs.Popen(cmd, cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    client = None
    try:
        wait_answering(url, server, log)
        ready_s = time.time() - started
        t0 = time.time()
        client_cmd = [sys.executable, "scripts/live_client.py", "--url", url, "--rollouts", str(rollouts),
                      "--concurrency", str(clients), "--wait", "0"]
        client = procs.Popen(client_cmd, cwd=ROOT, stdout=open(folder / "client.log", "wb"),
                             stderr=subprocess.STDOUT)
        release = None
        while release is None and time.time() - t0 < timeout:
            release = next((r for r in metrics(data_dir) if r["event"] == "release"), None)
            if client.poll() not in (None, 0):
                raise RuntimeError(f"live_client exited with {client.returncode}: "
                                   f"{(folder / 'client.log').read_text()[-3000:]}")
            time.sleep(1)
        client_rc = client.wait(600)  # every question asked and reported (its exit code says none failed)
        rows = metrics(data_dir)
    finally:
        if client is not None:
            client.stop(10)
        server.stop(60)
    steps = [r for r in rows if r["event"] == "step" and (release is None or r["time"] <= release["time"])]
    policy = [r for r in steps if r.get("phase") == "policy"]
    return {
        "arm": arm, "round": k, "command": " ".join(cmd[1:]), "ready_s": round(ready_s, 1),
        "first_release_s": round(release["time"] - t0, 1) if release else None,
        "release": release and {k_: release.get(k_) for k_ in ("release_id", "accuracy", "swap_s")},
        "train_s": [r["train_s"] for r in steps], "policy_step_s": [r["step_s"] for r in policy],
        "train_s_mean": round(statistics.mean(r["train_s"] for r in steps), 2) if steps else None,
        "policy_step_s_mean": round(statistics.mean(r["step_s"] for r in policy), 2) if policy else None,
        "client_exit_code": client_rc, **inference_records(data_dir),
        "loadavg_after": open("/proc/loadavg").read().split()[:3],
    }


def ratios(runs: list[dict], arm: str, base: str = "embedded") -> dict:
    """Per interleaved round, arm / base: the step time (whole round and policy step) and the first release."""
    out = {}
    for key in ("train_s_mean", "policy_step_s_mean", "first_release_s"):
        pairs = [(a[key], b[key]) for a in runs if a["arm"] == arm for b in runs
                 if b["arm"] == base and b["round"] == a["round"] and a[key] and b[key]]
        out[key] = [round(x / y, 2) for x, y in pairs]
    return out


def plot(runs: list[dict], arms: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, key, title in zip(axes, ("train_s", "policy_step_s", "first_release_s"),
                              ("training round (critic + policy), s", "policy step, s",
                               "first request to first release, s"), strict=True):
        for i, arm in enumerate(arms):
            vals = [v for r in runs if r["arm"] == arm for v in (r[key] if isinstance(r[key], list) else [r[key]])
                    if v is not None]
            ax.scatter([i] * len(vals), vals, alpha=0.6)
            if vals:
                ax.hlines(statistics.median(vals), i - 0.3, i + 0.3, color="k")
        ax.set_xticks(range(len(arms)), arms)
        ax.set_ylim(bottom=0)
        ax.set_title(title)
    fig.suptitle("Training beside the engine: live SAO (LoRA) on 2 CPUs, 16 SDK clients; medians as bars")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", default="embedded,vllm", help=f"comma-separated, of {sorted(ARMS)}")
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds of every arm")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rollouts", type=int, default=128, help="questions per run (the first release needs 96)")
    p.add_argument("--timeout", type=float, default=1200, help="most seconds a run waits for its first release")
    p.add_argument("--work", default="/tmp/bench-train-beside", help="run folders (data dirs, logs)")
    p.add_argument("--out", default=str(ROOT / "results" / "train-beside-vllm"), help="results path (no suffix)")
    args = p.parse_args()
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        raise SystemExit(f"unknown arms {sorted(unknown)}; choose from {sorted(ARMS)}")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    work = Path(os.path.realpath(work)) / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir()
    cfg = recipe_config(work)
    runs, began = [], time.time()
    for k in range(args.repeats):
        for arm in arms:
            print(f"[bench] round {k}: {arm}", file=sys.stderr, flush=True)
            runs.append(run_arm(arm, k, work, cfg, args.clients, args.rollouts, args.timeout))
            print(f"[bench]   {json.dumps({x: runs[-1][x] for x in ('first_release_s', 'train_s_mean', 'policy_step_s_mean', 'answers', 'failed', 'latency_max_s', 'client_exit_code')})}",
                  file=sys.stderr, flush=True)
    result = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "started": time.strftime(
        "%Y-%m-%d %H:%M UTC", time.gmtime(began)), "wall_s": round(time.time() - began), "cpus": os.cpu_count(),
        "recipe_config": yaml.safe_load(cfg.read_text()), "clients": args.clients, "rollouts": args.rollouts,
        "runs": runs, "ratios_to_embedded": {arm: ratios(runs, arm) for arm in arms if arm != "embedded"}}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    plot(runs, arms, out.with_suffix(".png"))
    print(json.dumps(result["ratios_to_embedded"], indent=2))


if __name__ == "__main__":
    main()
