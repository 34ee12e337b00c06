"""GEPA's search loop (arXiv 2507.19457): reflective mutation of a harness, Pareto pool, merge, metric-call budget.

One `Search` serves experiments (train/validation splits of a task set) and live scenarios (traffic as the training
set, its reports as observed rollouts). A step:

1. draw a parent from the Pareto front of the pool (chance proportional to the number of validation examples on
   whose front it stays, dominated candidates pruned as gepa 0.1.4 does: `pareto.select_parent`);
2. run it on a minibatch of training examples (epoch-shuffled), unless every rollout is already known;
3. give its traces and the verifier's textual feedback to the reflection model, which rewrites one component,
   chosen round-robin per candidate;
4. run the child on the same minibatch; keep it only if its score sum is strictly greater than the parent's;
5. score a kept child on the whole validation set and add it to the pool.
After a kept mutation a merge may follow (`use_merge`): two front candidates whose lineages changed different
components since their common ancestor are combined, and the merge is kept if it is at least as good as both parents
on a minibatch.

The budget counts metric calls: one per (candidate, example) rollout scored. Rollouts are cached by (harness text,
example), so a parent's minibatch already run, or a live rollout already reported, costs nothing again. Every event is
appended to `events.jsonl` in the run folder (what `apps/gepa.py` reads); `state.json` lets a run resume.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from reef_lab.harness import tree as harness_mod
from reef_lab.wire import OPENAI_CHAT
from reef_lab.wire.dialects import with_system
from reef_lab.files import write_atomic
from reef_lab.tasks.base import Task, verdict
from reef_lab.schema import check_fields

from .pareto import Candidate, accept, merge_pair, pareto_counts, select_parent

log = logging.getLogger("reef_lab.gepa")


@dataclass
class GEPAConfig:
    """The search's knobs; names follow `gepa.optimize` where they mean the same thing."""

    max_metric_calls: int = field(default=200, metadata={"client_max": 1_000_000,
        "help": "budget: rollouts scored (training minibatches and validation) before the search stops"})
    minibatch_size: int = field(default=3, metadata={"client_max": 64,
        "help": "training examples per reflective mutation"})
    use_merge: bool = field(default=True, metadata={"help": "try merging front candidates after a kept mutation"})
    max_merges: int = field(default=5, metadata={"client_max": 64, "help": "most merge attempts in a run"})
    perfect_score: float = field(default=1.0, metadata={"help": "an example's best possible score"})
    skip_perfect: bool = field(default=True, metadata={
        "help": "skip the reflection when the parent is perfect on the whole minibatch (nothing to learn)"})
    reflection_max_tokens: int = field(default=256, metadata={"client_max": 8192,
        "help": "max_tokens of the reflection model"})
    reflection_temperature: float = field(default=0.8, metadata={"help": "sampling temperature of the reflection"})
    seed: int = field(default=0, metadata={"help": "seed of parent draws, minibatches and reflection sampling"})
    components: list[str] | None = field(default=None, metadata={
        "help": "harness files the search may rewrite (default: every file of the seed harness)"})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.max_metric_calls < 1 or self.minibatch_size < 1:
            raise ValueError("max_metric_calls and minibatch_size must be at least 1")


@dataclass
class Rollout:
    """One example run under one candidate: what was sent, what came back, its score and the feedback text."""

    example_id: str
    score: float
    output: str
    feedback: str
    question: str = ""


class System(Protocol):
    def run(self, components: dict[str, str], examples: list[dict]) -> list[Rollout]:
        """Run the harness `components` on the examples; one scored rollout each, in order."""


def verifier_feedback(item: dict, text: str) -> tuple[float, str]:
    """The built-in verifier's score and its textual feedback (reef_lab.tasks.base.verdict)."""
    return verdict(item, text)


def user_text(messages: list[dict]) -> str:
    return "\n".join(str(m.get("content")) for m in messages if m.get("role") == "user")


class TaskSystem:
    """A chat model behind a harness, on task items, scored by the task (its `score` and `feedback`; without one,
    the built-in verifier on items {id, messages, answer})."""

    def __init__(self, lm, max_tokens: int = 48, concurrency: int = 16, task: Task | None = None):
        self.lm, self.max_tokens, self.concurrency, self.task = lm, max_tokens, concurrency, task

    def grade(self, item: dict, text: str) -> tuple[float, str]:
        if self.task is None:
            return verdict(item, text)
        return float(self.task.score(item, text)), self.task.feedback(item, text)

    def run(self, components: dict[str, str], examples: list[dict]) -> list[Rollout]:
        system = harness_mod.system_text(components)  # once per candidate, not per item

        def one(item: dict) -> Rollout:
            sent = with_system(OPENAI_CHAT, {"messages": item["messages"]}, system)["messages"]
            text = self.lm.complete(sent, max_tokens=self.max_tokens, temperature=0.0)
            score, feedback = self.grade(item, text)
            return Rollout(item["id"], score, text, feedback, user_text(item["messages"]))

        with ThreadPoolExecutor(max(1, min(self.concurrency, len(examples)))) as pool:
            return list(pool.map(one, examples))


REFLECTION_PROMPT = """You are improving one file of an AI assistant's instructions: `{component}`.

The current text of `{component}`:
```
{text}
```

Below are tasks the assistant was given with these instructions, its responses, and feedback on each.

{examples}

Write a new version of `{component}` that fixes the failures the feedback points out and keeps what works. \
Be concrete: state the exact answer format and any rule the feedback shows is needed. \
Reply with only the new text of `{component}`: plain instructions to the assistant, no code."""

FENCE_RE = re.compile(r"```[^\n`]*\n(.*?)(?:```|$)", re.S)


def extract_text(reply: str) -> str | None:
    """The text inside the first ``` block of a reply (or the reply itself when it has no fence)."""
    m = FENCE_RE.search(reply)
    text = (m.group(1) if m else reply).strip()
    return text or None


class Reflector:
    """Asks the reflection model for a new text of one component, from the parent's rollouts and feedback."""

    def __init__(self, lm, config: GEPAConfig):
        self.lm, self.config = lm, config

    def prompt(self, component: str, text: str, rollouts: list[Rollout]) -> str:
        blocks = [f"### Example {k}\nTask: {r.question}\nResponse: {r.output}\nScore: {r.score:g}\n"
                  f"Feedback: {r.feedback}" for k, r in enumerate(rollouts, 1)]
        return REFLECTION_PROMPT.format(component=component, text=text or "(empty)", examples="\n\n".join(blocks))

    def propose(self, component: str, text: str, rollouts: list[Rollout], call_seed: int) -> tuple[str | None, str]:
        reply = self.lm.complete([{"role": "user", "content": self.prompt(component, text, rollouts)}],
                                 max_tokens=self.config.reflection_max_tokens,
                                 temperature=self.config.reflection_temperature, seed=call_seed)
        return extract_text(reply), reply


def harness_hash(components: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(components, sort_keys=True).encode()).hexdigest()[:16]


class Search:
    """The GEPA loop over a pool of harness candidates. `step()` runs one iteration; `run()` until the budget."""

    def __init__(self, config: GEPAConfig, system: System, reflection_lm, trainset: list[dict],
                 valset: list[dict], seed_harness: dict[str, str], run_dir: str | Path | None = None,
                 on_event=None):
        if not valset:
            raise ValueError("GEPA needs a non-empty validation set")
        self.config, self.system = config, system
        self.reflector = Reflector(reflection_lm, config)
        self.trainset, self.valset = trainset, valset
        self.components = sorted(config.components or seed_harness)
        missing = [c for c in self.components if c not in seed_harness]
        if missing:
            raise ValueError(f"components {missing} are not files of the seed harness {sorted(seed_harness)}")
        self.seed_harness = dict(seed_harness)
        self.dir = Path(run_dir) if run_dir else None
        self.on_event = on_event  # called with every event row (trackers, live publishing)
        self.cands: dict[int, Candidate] = {}
        self.cache: dict[tuple[str, str], Rollout] = {}
        self._cache_lock = threading.Lock()  # live traffic is observed from another thread while a step runs
        self.metric_calls = 0
        self.iteration = 0
        self.merges = 0
        self._merge_due = False
        self._tried_merges: set[tuple[int, int]] = set()
        self._order: list[int] = []  # epoch-shuffled training indices still to draw
        self._next_component: dict[int, int] = {}
        self.rng = random.Random(config.seed)
        if self.dir:
            self.dir.mkdir(parents=True, exist_ok=True)
            if (self.dir / "state.json").exists():
                self._load()

    # ---- evaluation with a cache and a budget --------------------------------------------------------------
    def observe(self, components: dict[str, str], rollout: Rollout) -> None:
        """A rollout seen elsewhere (live traffic served under `components`): known from now on, free."""
        with self._cache_lock:
            self.cache[(harness_hash(components), rollout.example_id)] = rollout

    def evaluate(self, components: dict[str, str], examples: list[dict]) -> list[Rollout]:
        key = harness_hash(components)
        todo = [e for e in examples if (key, e["id"]) not in self.cache]
        if todo:
            rollouts = self.system.run(components, todo)
            with self._cache_lock:
                for r in rollouts:
                    self.cache[(key, r.example_id)] = r
            self.metric_calls += len(todo)
        return [self.cache[(key, e["id"])] for e in examples]

    @property
    def exhausted(self) -> bool:
        return self.metric_calls >= self.config.max_metric_calls

    # ---- the pool -------------------------------------------------------------------------------------------
    def start(self) -> Candidate:
        """Score the seed harness on the validation set (candidate 0)."""
        if 0 not in self.cands:
            scores = [r.score for r in self.evaluate(self.seed_harness, self.valset)]
            self._add(Candidate(0, dict(self.seed_harness), [], scores, None), origin="seed")
        return self.cands[0]

    def _add(self, cand: Candidate, origin: str, **extra) -> None:
        self.cands[cand.id] = cand
        parent = self.cands[cand.parents[0]] if cand.parents else None
        self._event({"event": "candidate", "id": cand.id, "origin": origin, "parents": cand.parents,
                     "changed": cand.changed, "components": cand.components, "scores": cand.scores,
                     "mean": cand.mean, "parent_mean": parent.mean if parent else None, **extra})
        counts = pareto_counts(self.pool())
        self._event({"event": "front", "front": {str(k): v for k, v in counts.items()},
                     "best": self.best().id, "best_mean": self.best().mean})
        self._save()

    def pool(self) -> dict[int, list[float]]:
        return {c.id: c.scores for c in self.cands.values()}

    def best(self) -> Candidate:
        return max(self.cands.values(), key=lambda c: (c.mean, -c.id))

    def _minibatch(self) -> list[dict]:
        out = []
        while len(out) < min(self.config.minibatch_size, len(self.trainset)):
            if not self._order:
                self._order = list(range(len(self.trainset)))
                self.rng.shuffle(self._order)
            i = self._order.pop()
            if self.trainset[i] not in out:
                out.append(self.trainset[i])
        return out

    # ---- one iteration --------------------------------------------------------------------------------------
    def step(self, minibatch: list[dict] | None = None) -> dict:
        """One reflective mutation (and a merge when one is due). Returns the iteration's event."""
        self.start()
        self.iteration += 1
        if self._merge_due and self.config.use_merge and self.merges < self.config.max_merges:
            self._merge_due = False
            merged = self._try_merge()
            if merged is not None:
                return merged
        parent = self.cands[select_parent(self.pool(), self.rng)]
        batch = minibatch or self._minibatch()
        ev = {"event": "iteration", "iteration": self.iteration, "kind": "mutation", "parent": parent.id,
              "minibatch": [e["id"] for e in batch]}
        if not batch:
            return self._event({**ev, "outcome": "no_examples"})
        before = self.metric_calls
        rollouts = self.evaluate(parent.components, batch)
        ev["parent_scores"] = [r.score for r in rollouts]
        if self.config.skip_perfect and all(r.score >= self.config.perfect_score for r in rollouts):
            return self._event({**ev, "outcome": "parent_perfect", "calls": self.metric_calls - before})
        k = self._next_component.get(parent.id, 0)
        component = self.components[k % len(self.components)]
        self._next_component[parent.id] = k + 1
        ev["component"] = component
        text, reply = self.reflector.propose(component, parent.components[component], rollouts,
                                             call_seed=self.config.seed * 100_003 + self.iteration)
        if text is None or text == parent.components[component].strip():
            return self._event({**ev, "outcome": "no_change", "reflection": reply,
                                "calls": self.metric_calls - before})
        child = {**parent.components, component: text}
        child_scores = [r.score for r in self.evaluate(child, batch)]
        ev.update(child_scores=child_scores, proposal=text)
        if not accept(child_scores, ev["parent_scores"]):
            return self._event({**ev, "outcome": "rejected", "calls": self.metric_calls - before})
        val = [r.score for r in self.evaluate(child, self.valset)]
        cand = Candidate(len(self.cands), child, [parent.id], val, component)
        self._merge_due = True
        self._add(cand, origin="mutation", iteration=self.iteration)
        return self._event({**ev, "outcome": "accepted", "child": cand.id, "child_mean": cand.mean,
                            "calls": self.metric_calls - before})

    def _try_merge(self) -> dict | None:
        front = sorted(pareto_counts(self.pool()))
        pairs = [(a, b) for i, a in enumerate(front) for b in front[i + 1:] if (a, b) not in self._tried_merges]
        self.rng.shuffle(pairs)
        for a, b in pairs:
            merged = merge_pair(self.cands, a, b)
            self._tried_merges.add((a, b))
            if merged is None or any(merged == c.components for c in self.cands.values()):
                continue
            self.merges += 1
            before = self.metric_calls
            batch = self._minibatch()
            sa = sum(r.score for r in self.evaluate(self.cands[a].components, batch))
            sb = sum(r.score for r in self.evaluate(self.cands[b].components, batch))
            sm = [r.score for r in self.evaluate(merged, batch)]
            ev = {"event": "iteration", "iteration": self.iteration, "kind": "merge", "parents": [a, b],
                  "minibatch": [e["id"] for e in batch], "parent_sums": [sa, sb], "child_scores": sm}
            if sum(sm) < max(sa, sb):
                return self._event({**ev, "outcome": "rejected", "calls": self.metric_calls - before})
            val = [r.score for r in self.evaluate(merged, self.valset)]
            cand = Candidate(len(self.cands), merged, [a, b], val, None)
            self._add(cand, origin="merge", iteration=self.iteration)
            return self._event({**ev, "outcome": "accepted", "child": cand.id, "child_mean": cand.mean,
                                "calls": self.metric_calls - before})
        return None

    def run(self, progress: bool = True) -> Candidate:
        """Iterate until the metric-call budget is spent; the best candidate by mean validation score."""
        from tqdm import tqdm

        self.start()
        bar = tqdm(total=self.config.max_metric_calls, initial=min(self.metric_calls, self.config.max_metric_calls),
                   desc="gepa metric calls", disable=not progress, dynamic_ncols=True)
        stalled = 0
        while not self.exhausted:
            before = self.metric_calls
            ev = self.step()
            bar.update(min(self.metric_calls, self.config.max_metric_calls) - min(before,
                                                                                  self.config.max_metric_calls))
            bar.set_postfix(iteration=self.iteration, pool=len(self.cands), best=round(self.best().mean, 3),
                            last=ev["outcome"])
            stalled = stalled + 1 if self.metric_calls == before else 0
            if stalled >= 50:  # every minibatch cached and every proposal unchanged: nothing left to spend on
                log.warning("gepa: 50 iterations without a new rollout; stopping at %d metric calls", before)
                break
        bar.close()
        return self.best()

    # ---- persistence ----------------------------------------------------------------------------------------
    def event(self, row: dict) -> dict:
        """Append a row (with the metric calls so far) to events.jsonl, for the app and trackers."""
        return self._event(row)

    def _event(self, row: dict) -> dict:
        row = {**row, "metric_calls": self.metric_calls}
        if self.dir:
            with open(self.dir / "events.jsonl", "a") as f:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            if row["event"] == "iteration":
                self._save()
        if self.on_event is not None:
            self.on_event(row)
        return row

    def _save(self) -> None:
        if not self.dir:
            return
        state = {"cands": [asdict(c) for c in self.cands.values()], "metric_calls": self.metric_calls,
                 "iteration": self.iteration, "merges": self.merges,
                 "next_component": self._next_component, "rng": _rng_state(self.rng),
                 "tried_merges": sorted(self._tried_merges), "order": self._order,
                 "val_ids": [e["id"] for e in self.valset],  # the order of each candidate's scores (apps/gepa.py)
                 "cache": [[k[0], asdict(r)] for k, r in self._cache_items()]}
        write_atomic(self.dir / "state.json", json.dumps(state).encode())

    def _cache_items(self) -> list:
        with self._cache_lock:
            return list(self.cache.items())

    def _load(self) -> None:
        state = json.loads((self.dir / "state.json").read_text())
        self.cands = {c["id"]: Candidate(**c) for c in state["cands"]}
        self.metric_calls, self.iteration, self.merges = state["metric_calls"], state["iteration"], state["merges"]
        self._next_component = {int(k): v for k, v in state["next_component"].items()}
        self._tried_merges = {tuple(p) for p in state["tried_merges"]}
        self._order = state["order"]
        self.cache = {(h, r["example_id"]): Rollout(**r) for h, r in state["cache"]}
        self.rng.setstate(_rng_unstate(state["rng"]))


def _rng_state(rng: random.Random) -> list:
    v, internal, g = rng.getstate()
    return [v, list(internal), g]


def _rng_unstate(s: list) -> tuple:
    return (s[0], tuple(s[1]), s[2])


def read_events(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
