"""Held-out evaluation straight on an engine: a release's greedy answers to a task's held-out items, scored by the
task's verifier. For offline re-scoring of finished runs (scripts/compare_recipes.py); a live candidate is judged by
reef_lab.publishing.releaser through the gateway's inference path, its answers kept as records."""

from __future__ import annotations

import time

from reef_lab.engines.base import ChatRequest, SamplingParams
from reef_lab.tasks.base import Task


def evaluate(engine, release: str, task: Task, items: list[dict], max_tokens: int) -> dict:
    """Accuracy of `release` (loaded in `engine`) on `items`, answering greedily; all items go in at once so the
    engine batches them."""
    started = time.perf_counter()
    handles = [engine.submit(ChatRequest(it["messages"], SamplingParams(max_tokens=max_tokens, temperature=0.0),
                                         release=release)) for it in items]
    texts = [h.result().text for h in handles]
    scores = [task.score(it, t) for it, t in zip(items, texts, strict=True)]
    return {"accuracy": sum(scores) / len(scores), "n": len(scores), "correct": int(sum(scores)),
            "release": release, "eval_s": round(time.perf_counter() - started, 2),
            "examples": [{"id": it["id"], "answer": it.get("answer"), "text": t, "score": sc}
                         for it, t, sc in list(zip(items, texts, scores, strict=True))[:8]]}
