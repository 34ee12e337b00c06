"""Generated tokens/s of the embedded engine and of vLLM CPU on the same model and prompts, side by side.

    .venv/bin/python scripts/bench/bench_engines.py            # writes results/engines.{md,png}, results/data/engines.json

Both engines serve the embedded SmolLM2 (its converted transformers folder); vLLM runs as reef_lab's `vllm`
engine starts it (`bash scripts/setup.sh --vllm` first). At each concurrency (1, 8, 32 by default) both engines
answer the same chat prompts (arithmetic questions, temperature 1.0, max_tokens 64), in alternating rounds; a
figure is generated tokens over the round's wall time. Beside them, this machine's compute limit for the model:
the measured fp32 matrix-multiply rate (torch, all threads) divided by the model's FLOPs per generated token
(2 x parameters), so each figure reads as a share of what the arithmetic allows.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from reef_lab.engines.base import ChatRequest, SamplingParams
from reef_lab.engines.embedded import DEFAULT_MODEL_NAME, EmbeddedEngine, default_cache_dir
from reef_lab.tasks.base import make_task
from scripts.common import ROOT, pyplot
from scripts.command_line import command_line, data_file


def matmul_rate(n: int = 1024, seconds: float = 3.0) -> float:
    """fp32 FLOP/s of square matrix products on this machine (torch's threads)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        done += 1
    return done * 2 * n ** 3 / (time.perf_counter() - t0)


def one_round(engine, prompts: list[list[dict]], concurrency: int, max_tokens: int) -> dict:
    def ask(i: int) -> int:
        req = ChatRequest(prompts[i % len(prompts)], SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i))
        return len(engine.submit(req).result().token_ids)

    n = max(concurrency * 2, 8)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(ask, range(n)))
    wall = time.perf_counter() - t0
    return {"requests": n, "tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per engine and concurrency")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "results" / "engines"), help="page path without extension")
    args = ap.parse_args(argv)
    model_dir = default_cache_dir() / DEFAULT_MODEL_NAME
    embedded = EmbeddedEngine.from_path(None, max_batch=32)
    from reef_lab.engines.vllm import VLLMEngine

    print("[bench] starting vLLM", file=sys.stderr, flush=True)
    vllm = VLLMEngine(model_dir, port=8961)
    params = sum(p.numel() for p in embedded.model.parameters())
    rate = matmul_rate()
    limit = rate / (2 * params)
    prompts = [it["messages"] for it in make_task().items(64, seed=7)]
    engines = {"embedded": embedded, "vllm": vllm}
    for e in engines.values():  # warm-up
        one_round(e, prompts, 4, 8)
    rows = []
    try:
        for c in args.concurrency:
            for r in range(args.rounds):
                order = list(engines) if r % 2 == 0 else list(reversed(engines))
                for name in order:
                    print(f"[bench] {name}: concurrency {c}, round {r + 1}/{args.rounds}", file=sys.stderr,
                          flush=True)
                    rows.append({"engine": name, "concurrency": c, "round": r,
                                 **one_round(engines[name], prompts, c, args.max_tokens)})
    finally:
        vllm.close()
        embedded.close()
    summary = {}
    for name in engines:
        for c in args.concurrency:
            vals = [x["tokens_per_s"] for x in rows if x["engine"] == name and x["concurrency"] == c]
            summary[f"{name}@{c}"] = {"mean": round(sum(vals) / len(vals), 2), "rounds": vals}
    out = Path(args.out)
    command = command_line([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    written = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    data = {"written": written, "machine": platform.processor() or platform.machine(), "cpus": torch.get_num_threads(),
            "params": params, "matmul_flops": rate, "limit_tokens_per_s": limit, "rows": rows, "summary": summary,
            "max_tokens": args.max_tokens}
    data_file(out).write_text(json.dumps(data, indent=2))
    _plot(out.with_suffix(".png"), summary, args.concurrency, limit)
    lines = [
        "# Engines: generated tokens/s on this machine, embedded vs vLLM CPU", "",
        f"Command: `{command}`, written {written} on {torch.get_num_threads()} CPU threads; model "
        f"SmolLM2-135M-Instruct (fp32, {params / 1e6:.1f} M parameters) in both; vLLM CPU 0.32 as reef_lab's `vllm` "
        f"engine starts it (OpenMP bound to every CPU, `--enforce-eager`). Prompts: arithmetic questions, "
        f"temperature 1.0, max_tokens {args.max_tokens}; {args.rounds} alternating rounds per cell, each round "
        f"max(2 x concurrency, 8) requests.", "",
        f"Compute limit: fp32 matrix multiply measured at {rate / 1e9:.1f} GFLOP/s; at 2 x {params / 1e6:.1f} M "
        f"FLOPs per generated token that is **{limit:.0f} tokens/s** (a bound no engine reaches: decoding also "
        "reads the weights and the cache, and attention is not counted).", "",
        "![tokens/s](engines.png)", "",
        "| concurrency | embedded tokens/s | vLLM tokens/s | vLLM / embedded | embedded share of the limit | vLLM share |",
        "|---|---|---|---|---|---|"]
    for c in args.concurrency:
        e, v = summary[f"embedded@{c}"], summary[f"vllm@{c}"]
        lines.append(f"| {c} | {e['mean']} ({', '.join(map(str, e['rounds']))}) | {v['mean']} "
                     f"({', '.join(map(str, v['rounds']))}) | {v['mean'] / e['mean']:.2f} | "
                     f"{e['mean'] / limit:.1%} | {v['mean'] / limit:.1%} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(out.with_suffix(".md").read_text())


def _plot(path: Path, summary: dict, levels: list[int], limit: float) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.38
    xs = range(len(levels))
    for k, name in enumerate(["embedded", "vllm"]):
        ax.bar([x + (k - 0.5) * width for x in xs], [summary[f"{name}@{c}"]["mean"] for c in levels], width,
               label=name)
    ax.axhline(limit, color="grey", linestyle="--", label=f"compute limit {limit:.0f}")
    ax.set_xticks(list(xs), [str(c) for c in levels])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("generated tokens/s")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
