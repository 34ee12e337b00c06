"""The judge: a release's held-out score, one way for every caller. The releaser judges a live candidate (and the
serving release, and retention) with answers from the gateway's inference path, each kept as an `eval` record;
an offline re-scoring of a finished run (reef_lab.learning.evaluation) answers straight from an engine. Both give
`judge` a way to answer and get the same result: accuracy, n, correct, the release, the time it took and the first
8 answers."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

EXAMPLES = 8  # answers kept with a result (the apps show them beside the score)

# (messages, tools or None) -> the assistant message in OpenAI chat shape
Chat = Callable[[list, "list[dict] | None"], dict]


@dataclass
class HeldOut:
    """A held-out task a candidate is scored on: its items, the task's verifier, the answers' max_tokens."""

    task: Any  # reef_lab.tasks.base.Task
    items: list[dict]
    max_tokens: int


def judge(task, items: list[dict], chat: Chat, release: str, workers: int = 64) -> dict:
    """Accuracy of `release` on `items`, each answered through `chat` (one reply, or a tool task's whole episode:
    Task.rollout) and scored by the task's verifier; the items go in together so the engine batches them."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max(1, min(len(items), workers)), thread_name_prefix="reef-eval") as pool:
        scores, texts = zip(*pool.map(lambda it: task.rollout(chat, it), items))
    return {"accuracy": sum(scores) / len(scores), "n": len(scores), "correct": int(sum(scores)),
            "release": release, "eval_s": round(time.perf_counter() - started, 2),
            "examples": [{"id": it["id"], "answer": it.get("answer"), "text": t, "score": sc}
                         for it, t, sc in list(zip(items, texts, scores, strict=True))[:EXAMPLES]]}
