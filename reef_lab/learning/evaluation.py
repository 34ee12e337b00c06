"""Held-out evaluation straight on an engine: a release's greedy answers to a task's held-out items, scored by the
task's verifier, for offline re-scoring of finished runs (scripts/studies/compare_recipes.py). The same judge as a live
candidate's (reef_lab.publishing.judge), which answers through the gateway's inference path instead and keeps
each answer as a record."""

from __future__ import annotations

from reef_lab.engines.base import ChatRequest, SamplingParams
from reef_lab.publishing.judge import judge
from reef_lab.tasks.base import Task


def evaluate(engine, release: str, task: Task, items: list[dict], max_tokens: int) -> dict:
    """Accuracy of `release` (loaded in `engine`) on `items`, answering greedily (tool-less tasks)."""
    def chat(messages: list, tools: list | None) -> dict:
        request = ChatRequest(messages, SamplingParams(max_tokens=max_tokens, temperature=0.0), release=release)
        return {"role": "assistant", "content": engine.submit(request).result().text}
    return judge(task, items, chat, release)
