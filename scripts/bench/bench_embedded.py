"""Measure the embedded engine: load time from the converted cache, and decode throughput for one request alone
versus N concurrent requests (continuous batching).

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench/bench_embedded.py              # SmolLM2, 64 tokens, 1 vs 8
    .venv/bin/python scripts/bench/bench_embedded.py --concurrency 16 --max-tokens 128
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from reef_lab.engines.base import ChatRequest, SamplingParams
from reef_lab.engines.embedded import EmbeddedEngine, default_cache_dir, load_model

TOPICS = ["a lighthouse keeper", "a coral reef", "a lost robot", "a mountain village", "a deep-sea diver",
          "an old library", "a desert caravan", "a city at night", "a clockmaker", "a migrating whale",
          "a small bakery", "a space station", "a forest fire", "a chess champion", "a river delta", "a storm"]


def requests(count: int, max_tokens: int) -> list[ChatRequest]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    return [ChatRequest([{"role": "user", "content": f"Write a long, detailed story about {TOPICS[i % len(TOPICS)]}."}],
                        params) for i in range(count)]


def timed_run(engine: EmbeddedEngine, batch: list[ChatRequest]) -> tuple[float, int]:
    started = time.perf_counter()
    streams = [engine.submit(r) for r in batch]
    tokens = sum(len(s.result(timeout=600).token_ids) for s in streams)
    return time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="HF folder or .gguf; default: the embedded SmolLM2")
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir(), help="where converted models live")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per request")
    parser.add_argument("--concurrency", type=int, default=8, help="requests submitted together")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    started = time.perf_counter()
    import transformers  # noqa: F401  (timed apart from the load itself)

    imports = time.perf_counter() - started
    started = time.perf_counter()
    load_model(args.model_path, args.cache_dir)  # converts on first use, so the timing below is a cache load
    first = time.perf_counter() - started
    started = time.perf_counter()
    model, tokenizer, name = load_model(args.model_path, args.cache_dir)
    print(f"model {name}: import transformers {imports:.1f} s; first load_model {first:.1f} s (includes any "
          f"conversion); second load from cache {time.perf_counter() - started:.1f} s")

    with EmbeddedEngine(model, tokenizer, name, max_batch=max(args.concurrency, 1)) as engine:
        timed_run(engine, requests(1, 4))  # warm-up
        seconds, tokens = timed_run(engine, requests(1, args.max_tokens))
        print(f"1 request alone:      {tokens:4d} tokens in {seconds:5.1f} s = {tokens / seconds:6.1f} tok/s")
        seconds, tokens = timed_run(engine, requests(args.concurrency, args.max_tokens))
        print(f"{args.concurrency} concurrent requests: {tokens:4d} tokens in {seconds:5.1f} s = "
              f"{tokens / seconds:6.1f} tok/s total, {tokens / seconds / args.concurrency:5.1f} tok/s per request")
        print(engine.info())


if __name__ == "__main__":
    main()
