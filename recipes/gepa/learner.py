"""The harness learner: per scenario whose recipe evolves a harness (GEPA), turns reported traffic into releases.

Live traffic is the training set. A report on an inference, with `feedback` text (and/or a score) and the reference
answer in `metadata.<answer_key>`, makes one training example: the client's request (without the harness) and its
answer. The rollout the client saw is observed under the harness release that served it, so when that harness is the
parent GEPA draws, its minibatch score and the feedback reflection reads are the user's own and cost no metric call.
Every `minibatch_size` new examples (mode auto/hybrid) or on POST /reef/train (manual/hybrid) the learner runs one
GEPA iteration on the newest examples (recipes/gepa/search.py); a child it keeps is scored on the validation
set, and when the selection policy passes it (strict_gain: its validation mean beats the serving harness's) it is
published as a harness release: the scenario's next requests are served with it, `GET /reef/harness` returns it.

A scenario with no harness release yet serves the recipe's seed harness as release v1 as soon as the learner starts,
so all traffic it learns from was served under a known harness. State lives in `data_dir/learn/<scenario>/`:
`state.json` (reports consumed) and `gepa/` (the search's events and state; a restart resumes it).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import orjson

from reef_lab.wire.text import request_messages, response_text
from reef_lab.errors import Conflict
from reef_lab.harness.change_requests import ChangeRequests, LazyLM
from reef_lab.learning.loop import LearnerLoop
from reef_lab.learning.recipe import LearnContext, RecordHolder
from reef_lab.tasks.base import make_task
from reef_lab.files import write_json

from .search import Rollout, Search, TaskSystem, harness_hash

log = logging.getLogger("recipes.gepa.learner")


class HarnessLearner(LearnerLoop, RecordHolder):
    def __init__(self, ctx: LearnContext, recipe):
        scenario, tracker = ctx.scenario, ctx.tracker
        self.scenario, self.recipe, self.config = scenario, recipe, recipe.config
        task_lm = ctx.make_lm(self.config.task_lm)
        reflection_lm = ctx.make_lm(self.config.reflection_lm) if self.config.reflection_lm else task_lm
        self.records, self.releaser = ctx.records, ctx.releaser
        self.dir = Path(ctx.state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._state_path = self.dir / "state.json"
        state = orjson.loads(self._state_path.read_bytes()) if self._state_path.exists() else {}
        self._consumed: set[str] = set(state.get("consumed", []))
        self.examples: list[dict] = state.get("examples", [])
        self._example_ids = {e["id"] for e in self.examples}
        self._new = state.get("new", 0)  # examples since the last iteration
        self._init_loop()
        serving = self._serving_files()
        if serving is None:
            if not self.releaser.index(scenario)["releases"]:  # serve the seed first: every example was served
                self.releaser.publish_harness(scenario, dict(self.config.seed_harness),  # under a known harness
                                              {"recipe": recipe.name, "gepa": {"candidate": 0, "origin": "seed"}})
            # else a later release dropped the harness (a composite's ctxd distilled it into the weights): it stays
            # dropped; the search starts again from the seed without serving it
            serving = dict(self.config.seed_harness)
        task = make_task(self.config.val_task)
        val = task.items(self.config.val_size, seed=self.config.val_seed)
        self.system = TaskSystem(task_lm, self.config.task_max_tokens, concurrency=8, task=task)
        self.tracker = tracker  # a reef_lab.publishing.tracking.Tracker mirroring every search event to W&B
        self.search = Search(self.config.search_config(), self.system, reflection_lm, self.examples, val, serving,
                             self.dir / "gepa", on_event=tracker.log if tracker is not None else None)
        self._replay()
        req_cfg = self.config.request_config()  # change requests in plain words: reef_lab/harness/change_requests.py
        proposer = LazyLM(lambda: ctx.make_lm(req_cfg.proposer_lm))  # None: the deployment's model (its upstream)
        self.requests = ChangeRequests(scenario, ctx.releaser, ctx.records, ctx.data_dir, proposer, req_cfg,
                                       recipe.name, self._evaluate_request, store=ctx.requests)
        self._start(f"reef-gepa-{scenario}")

    # ---- inputs ---------------------------------------------------------------------------------------------
    def on_record(self, record: dict) -> None:
        if record.get("kind") == "report":
            self._queue(record)

    def on_report(self, report: dict) -> None:
        self._queue(report)

    def promote(self, candidate: str) -> dict:
        rel = self.requests.promote(candidate)
        if rel is None:
            raise Conflict("a GEPA scenario publishes kept candidates itself (selection always, no_regression or "
                           "strict_gain); only candidates of change requests (requests.selection promote) wait "
                           "for review")
        return rel

    def request_change(self, body: dict) -> dict:
        """A change request in plain words (reef_lab/harness/change_requests.py), in mode manual or hybrid."""
        if self.config.mode == "auto":
            raise Conflict(f"scenario {self.scenario!r} evolves its harness in mode 'auto'; set mode 'manual' or "
                           "'hybrid' to take change requests")
        return self.requests.submit(body)

    def _evaluate_request(self, files: dict[str, str]) -> tuple[bool, str]:
        """GEPA's evaluation of a requested change: its validation mean may not fall below the serving harness's."""
        mean = self._val_mean(files)
        serving = self._val_mean(self._serving_files() or {})
        return mean >= serving, f"validation {mean:.4f} vs serving {serving:.4f} (no_regression)"

    def _val_mean(self, files: dict[str, str]) -> float:
        scores = [r.score for r in self.search.evaluate(files, self.search.valset)]
        return sum(scores) / len(scores)

    def close(self, timeout: float = 60.0) -> None:
        self.requests.close()
        super().close(timeout)

    def on_rollback(self) -> None:
        return None  # the search goes on from its candidates; the rolled-back harness serves until the next release

    def request_training(self) -> dict:
        def check() -> dict:
            if not self.examples:
                raise Conflict("no training examples yet: report on inferences with feedback and "
                               f"metadata.{self.config.answer_key} (the reference answer)")
            return {"examples": len(self.examples)}
        return self._ask_round(f"scenario {self.scenario!r} evolves its harness in mode 'auto'; set mode 'manual' "
                               "or 'hybrid' to run iterations on request", check)

    def held_records(self) -> set[str]:
        """Reports queued and the inferences they reference; a drained report's examples are copies (state.json)."""
        with self._cv:
            return {rid for rec in self._inbox for rid in (rec["id"], *(rec.get("references") or ()))}

    def status(self) -> dict:
        with self._cv:
            return {"recipe": self.recipe.name, "mode": self.config.mode, "phase": self.phase,
                    "examples": len(self.examples), "pool": self._new, "inbox": len(self._inbox),
                    "rounds": self.rounds, "metric_calls": self.search.metric_calls,
                    "budget": self.search.config.max_metric_calls, "candidates": len(self.search.cands),
                    "requests_queued": self.requests.pending(), "last_error": self.last_error}

    # ---- examples from reports ------------------------------------------------------------------------------
    def _replay(self) -> None:
        for rec in self.records.get_many(self.records.ids("report")):
            if rec["id"] not in self._consumed:
                self._inbox.append(rec)

    def _serving_files(self) -> dict[str, str] | None:
        return self.releaser.harness_files(self.scenario)

    def _drain(self) -> None:
        """Reports -> examples and observed rollouts (caller holds the lock)."""
        changed = False
        while self._inbox:
            report = self._inbox.popleft()
            if report["id"] in self._consumed:
                continue
            self._consumed.add(report["id"])
            changed = True
            answer = (report.get("metadata") or {}).get(self.config.answer_key)
            if answer is None:
                continue  # no reference answer: a child could not be scored on it
            for inf in self.records.get_many(report.get("references") or []):
                try:
                    self._add_example(inf, report, str(answer))
                except Exception as e:  # noqa: BLE001 - one odd record is data, not a reason to stop
                    log.warning("scenario %s: inference %s cannot become an example: %s", self.scenario,
                                inf.get("id"), e)
        if changed:
            self._save()

    def _add_example(self, inf: dict, report: dict, answer: str) -> None:
        messages = request_messages(inf.get("dialect"), inf.get("request") or {})
        if not messages or inf.get("status", "ok") != "ok":
            return
        item = {"id": inf["id"], "messages": messages, "answer": answer}
        output = response_text(inf.get("dialect"), inf.get("response"))
        score, verdict = self.system.grade(item, output)
        feedback = report.get("feedback")
        if isinstance(feedback, dict):
            feedback = json.dumps(feedback, ensure_ascii=False)
        rollout = Rollout(inf["id"], score, output, feedback or verdict,
                          "\n".join(m["content"] for m in messages if m["role"] == "user"))
        served = self.releaser.harness_files(self.scenario, inf.get("release_id") or "")
        if served is not None:
            self.search.observe(served, rollout)
        if item["id"] not in self._example_ids:  # an inference referenced by two reports is one example
            self._example_ids.add(item["id"])
            self.examples.append(item)
            self._new += 1

    def _save(self) -> None:
        write_json(self._state_path, {"consumed": sorted(self._consumed), "examples": self.examples,
                                      "new": self._new})

    # ---- the learner thread ---------------------------------------------------------------------------------
    def _due(self) -> bool:
        return (self.config.mode != "manual" and self._new >= self.search.config.minibatch_size
                and not self.search.exhausted)

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._wait_for_round():
                    return
                self._manual = max(0, self._manual - 1)
                batch = self.examples[-self.search.config.minibatch_size:]
                self._new = 0
                self._save()
                self.phase = "searching"
            try:
                self._iteration(batch)
                self.last_error = None
            except Exception as e:  # noqa: BLE001 - a failed iteration leaves serving as it was, and says why
                log.exception("scenario %s: GEPA iteration failed", self.scenario)
                self.last_error = f"{type(e).__name__}: {e}"
                time.sleep(1.0)
            finally:
                with self._cv:
                    self.phase = "idle"

    def _iteration(self, batch: list[dict]) -> None:
        ev = self.search.step(minibatch=batch)
        self.rounds += 1
        log.info("scenario %s: GEPA iteration %d %s (%d metric calls)", self.scenario, ev["iteration"],
                 ev["outcome"], self.search.metric_calls)
        if ev["outcome"] != "accepted":
            return
        child = self.search.cands[ev["child"]]
        serving = self._serving_files() or {}
        serving_mean = None
        for c in self.search.cands.values():
            if harness_hash(c.components) == harness_hash(serving):
                serving_mean = c.mean
        if serving_mean is None:  # a harness published by hand: score it on the validation set once
            scores = [r.score for r in self.search.evaluate(serving, self.search.valset)]
            serving_mean = sum(scores) / len(scores)
        # judged by the releaser's selection policy on the validation means (the search scored both)
        entry = self.releaser.publish_harness(self.scenario, child.components, {
            "recipe": self.recipe.name, "records": [e["id"] for e in batch],
            "gepa": {"candidate": child.id, "parents": child.parents, "changed": child.changed,
                     "val_mean": child.mean, "serving_val_mean": serving_mean,
                     "metric_calls": self.search.metric_calls}},
            selection=self.config.selection, scores={"accuracy": child.mean, "size": len(child.scores)},
            serving_scores={"accuracy": serving_mean})
        if "release" not in entry:
            self.search.event({"event": "release_skipped", "candidate": child.id, "reason": entry["reason"]})
            return
        self.search.event({"event": "release", "release_id": entry["release"]["release_id"], "candidate": child.id,
                           "reason": entry["reason"]})
