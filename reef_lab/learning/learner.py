"""The learner: per scenario, turns scored samples into candidates and candidates into releases, while serving goes on.

Reports arrive on request threads and are only queued (`on_report` costs microseconds); the learner's own thread
turns them into samples (inference record + score), keeps the recipe's pool, and when the recipe is ready (mode
`auto`/`hybrid`) or asked (`manual`/`hybrid`, POST /reef/train) takes one training step. Every
`steps_per_candidate` policy steps it exports a candidate, loads it beside the serving weights, scores it on the
held-out task, and lets the selection policy decide; an accepted candidate becomes release vN+1 and the engine
routes the scenario's new requests to it (requests already running finish on their release). Anything that fails
in a round is logged, recorded in the metrics file and leaves the serving release as it was.

Records become samples in reef_lab.learning.intake; what training consumed and what failed is the ledger's
(reef_lab.learning.ledger). State under `data_dir/learn/<scenario>/`: `state.json` (the ledger: consumed sample
ids, those a candidate was made from and those dropped, so a restart replays only the reports whose learning did not
reach a candidate; and the failed ones, each with its error) and `metrics.jsonl` (one line per step, evaluation,
candidate and release: the source the apps and trackers read; a step's row also averages the numbers its batch's reports carry in `metadata`,
as `report_<key>`, e.g. a tool task's `report_valid_call_fraction`). A restart resumes from the serving
release's weights (optimizer state starts fresh): steps taken since the last candidate died with the process, so
their samples count as consumed only once a candidate is made from them, and are trained again after a crash.
Nothing acknowledged is skipped without a trace (issue 38): a round that fails before its step trained the batch gives
the batch back to the front of the pool, and the next round (after a wait that grows with each failure in a row)
trains it; a candidate whose export fails leaves its samples to the next candidate. A sample the step names as one it
cannot run (InvalidSamples: token ids outside the model's vocabulary, a stored request that cannot be templated
again with a teacher's context, per-token values of the wrong length) is failed alone at once and the others pay no
try for it; a sample in MAX_TRIES failed rounds whose error names no sample (the round's own: memory, disk, an
engine) is failed too, so one that always fails cannot stall the scenario. A failed sample is
consumed and listed with its error in `status()["failed"]`, in state.json and as a `failed` metrics row; a report
that cannot become a sample at all is listed there too (not consumed: a restart tries it again).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from contextlib import nullcontext
from pathlib import Path

import orjson

from reef_lab._moved import sample_fields
from reef_lab.engines.base import ReleaseHost, YieldsToTraining
from reef_lab.errors import Conflict
from reef_lab.files import JsonDoc
from reef_lab.learning.loop import LearnerLoop
from reef_lab.learning.intake import Intake, batch_report_means, report_measures  # noqa: F401 - its old home
from reef_lab.learning.ledger import Ledger
from reef_lab.learning.recipe import LearnConfig, LearnContext, RecordHolder
from reef_lab.trainers.samples import Sample
from reef_lab.tasks.base import make_task
from reef_lab.publishing.judge import HeldOut
from reef_lab.publishing.releases import BASE
from reef_lab.trainers.samples import InvalidSamples

log = logging.getLogger("reef_lab.learning.learner")
MAX_TRIES = 3  # failed rounds a sample may be in before it is failed (its error kept)
RETRY_WAIT_S = 2.0  # the wait after a failed round, doubled with each failure in a row (at most MAX_WAIT_S)
MAX_WAIT_S = 60.0


class WeightRecipe(ABC):
    """The base of recipes that train the served model's weights: the shared learner below drives these hooks.
    `config` is a LearnConfig subclass (mode, selection, held-out task, trainer)."""

    name: str
    evolves = "weights"
    absorbs: tuple[str, ...] = ()  # components its releases make unneeded: a composite's manifest drops them
    config: LearnConfig

    def validate_report(self, report: dict) -> None:
        return None

    def learner(self, ctx: LearnContext) -> Learner:
        return Learner(ctx, self)

    @property
    def rollouts_per_prompt(self) -> int:
        """How many rollouts of one prompt the recipe compares (experiments send this many per prompt)."""
        return 1

    @abstractmethod
    def accepts(self, sample: Sample) -> bool:
        """Whether a scored sample may join the pool."""

    @abstractmethod
    def ready(self, pool: list[Sample], trainer_step: int, release_steps: dict[str, int]) -> bool:
        """Whether the pool holds a batch."""

    @abstractmethod
    def build_batch(self, pool: list[Sample], trainer_step: int,
                    release_steps: dict[str, int]) -> tuple[list[Sample], list[Sample]]:
        """(batch to train on now, samples to drop for good, e.g. too stale). Both leave the pool."""

    def make_trainer(self, model_dir: Path, init_folder: Path | None):
        """The trainer state (a reef_lab.trainers.base.Trainer, or an object holding one): needs `steps` and
        `export(folder, metadata)`. Default: the backend the config's `trainer` names."""
        from reef_lab.trainers import make_trainer

        return make_trainer(self.config.trainer, model_dir, init_folder)

    @abstractmethod
    def train(self, trainer, batch: list[Sample]) -> dict:
        """One training step on the batch; metrics (with `policy_step`: whether the policy's weights moved)."""


class Learner(LearnerLoop, RecordHolder):
    def __init__(self, ctx: LearnContext, recipe: WeightRecipe):
        engine = ctx.engine
        if not isinstance(engine, ReleaseHost) or engine.model_dir is None:
            raise Conflict(f"recipe {recipe.name!r} trains weights, but this engine serves none it can train "
                           "(an upstream provider); serve the embedded model or use a harness recipe")
        scenario, tracker = ctx.scenario, ctx.tracker
        self.scenario, self.recipe, self.config = scenario, recipe, recipe.config
        self.records, self.engine, self.releaser = ctx.records, engine, ctx.releaser
        self.dir = Path(ctx.state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.ledger = Ledger(ctx.ledger or JsonDoc(self.dir / "state.json"), self._metric)  # consumed, failed
        self.intake = Intake(recipe, engine, ctx.records, self.config.episodes)  # records to samples
        self._init_loop()
        self._pool: list[Sample] = []
        self._in_round: list[Sample] = []  # taken from the pool by the round now training
        self._seen: set[str] = set()  # record ids that joined the pool in this process
        self._drained: set[str] = set()  # report ids turned into samples in this process
        self._reset = False
        self._failures = 0  # rounds failed in a row (the wait before the next grows with it)
        self.tracker = tracker  # a reef_lab.publishing.tracking.Tracker mirroring every metrics row to W&B
        self._trainer = None
        self._since_candidate: list[Sample] = []
        self._policy_steps_since_candidate = 0
        self._held_out: HeldOut | None = None
        self._task = make_task(self.config.eval_task) if self.config.eval_task else None
        self._retention_task = make_task(self.config.retention_task) if self.config.retention_task else None
        self._retention: HeldOut | None = None
        self._replay()
        self._start(f"reef-learner-{scenario}")

    # ---- inputs (request threads) ---------------------------------------------------------------------------
    def on_record(self, record: dict) -> None:
        self._queue(("demo" if record.get("kind") == "train" else "report", record))

    def on_report(self, report: dict) -> None:
        self._queue(("report", report))

    def promote(self, candidate: str) -> dict:
        return self.publish(candidate)

    def request_change(self, body: dict) -> dict:
        from reef_lab.harness.change_requests import refuse_change

        raise refuse_change(self.recipe.name)

    def on_rollback(self) -> None:
        self.reset_trainer()

    def request_training(self) -> dict:
        def check() -> dict:
            if not self._ready():
                raise Conflict(f"not enough samples to train: the pool holds {len(self._pool)} eligible sample(s); "
                               f"recipe {self.recipe.name!r} needs a full batch")
            return {"pool": len(self._pool)}
        return self._ask_round(f"scenario {self.scenario!r} trains in mode 'auto' (whenever a batch is ready); "
                               "set mode 'manual' or 'hybrid' to train on request", check)

    def reset_trainer(self) -> None:
        """Start the next round from the serving release's weights (after a rollback)."""
        with self._cv:
            self._reset = True
            self._policy_steps_since_candidate = 0

    def held_records(self) -> set[str]:
        """Reports queued, samples in the pool or training now, and samples trained on since the last candidate
        (its lineage will name them), with their reports. Read in the order a record moves through them, so one
        that moves on meanwhile is still seen."""
        held: set[str] = set()
        with self._cv:
            for _, rec in self._inbox:
                held.add(rec["id"])
                held.update(rec.get("references") or ())
            samples = [*self._pool, *self._in_round]
        samples += list(self._since_candidate)
        for s in samples:
            held.update(s.record_ids)
            if s.report_id:
                held.add(s.report_id)
        return held

    def status(self) -> dict:
        with self._cv:
            return {"recipe": self.recipe.name, "mode": self.config.mode, "phase": self.phase,
                    "pool": len(self._pool), "inbox": len(self._inbox), "rounds": self.rounds,
                    "trainer_step": self._trainer.steps if self._trainer else None,
                    "consumed": len(self.ledger.consumed), "last_error": self.last_error,
                    "failed_samples": len(self.ledger.failed), "failed": self.ledger.newest_failed(),
                    "episodes": dict(self.intake.episode_counts)}

    # ---- the learner thread ---------------------------------------------------------------------------------
    def _replay(self) -> None:
        """Queue reports (and demonstrations) that training has not consumed yet."""
        for kind in ("report", "train"):
            for rec in self.records.get_many(self.records.ids(kind)):
                self._inbox.append(("report" if kind == "report" else "demo", rec))

    def _drain(self) -> None:
        """Turn queued reports into pool samples (caller holds the lock)."""
        while self._inbox:
            kind, rec = self._inbox.popleft()
            if kind == "report":  # a report replayed at start and delivered live is read once (episode counts)
                if rec["id"] in self._drained:
                    continue
                self._drained.add(rec["id"])
            try:
                samples = self.intake.samples(kind, rec, self.ledger.consumed.__contains__)
            except Exception as e:  # noqa: BLE001 - one bad record is data, not a reason to stop learning
                log.warning("scenario %s: record %s cannot become a sample: %s", self.scenario, rec.get("id"), e)
                self.ledger.fail({rec["id"]: {"error": f"cannot become a sample: {type(e).__name__}: {e}",
                                              "rounds": 0, "records": list(rec.get("references") or [])}})
                continue
            self.ledger.recovered(rec["id"])  # it may have failed to become one before
            for s in samples:
                ids = s.record_ids
                if not self.ledger.consumed.intersection(ids) and not self._seen.intersection(ids) and \
                        self.recipe.accepts(s):
                    self._seen.update(ids)  # a report replayed at start and delivered live counts once
                    self._pool.append(s)

    def _release_steps(self) -> dict[str, int]:
        idx = self.releaser.index(self.scenario)
        return {BASE: 0, **{r["release_id"]: r.get("trainer_step") or 0 for r in idx["releases"]}}

    def _trainer_step(self) -> int:
        if self._trainer is not None:
            return self._trainer.steps
        serving = self.releaser.serving_release(self.scenario)
        return (serving or {}).get("trainer_step") or 0

    def _ready(self) -> bool:
        return self.recipe.ready(self._pool, self._trainer_step(), self._release_steps())

    def _due(self) -> bool:
        return self.config.mode != "manual" and self._ready()

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._wait_for_round():
                    return
                manual = self._manual > 0
                self._manual = max(0, self._manual - 1)
                self._pool.sort(key=lambda s: s.content_key)  # by content, not arrival: same samples, same batches
                batch, dropped = self.recipe.build_batch(self._pool, self._trainer_step(), self._release_steps())
                sample_fields(batch)  # a 0.1 recipe's extra["advantages"], until 0.3.0 (reef_lab/_moved.py)
                taken = {s.record_id for s in batch + dropped}
                self._pool = [s for s in self._pool if s.record_id not in taken]
                self._in_round = batch
                self.phase = "training"
            try:
                self._round(batch, dropped, manual)
                self.last_error = None
                self._failures = 0
            except Exception as e:  # noqa: BLE001 - a failed round leaves serving as it was, and says why
                with self._cv:
                    if self._give_back(self._in_round, e):  # the samples' fault: the others train next round
                        log.warning("scenario %s: %s", self.scenario, e)
                        continue
                log.exception("scenario %s: training round failed", self.scenario)
                self.last_error = f"{type(e).__name__}: {e}"
                self._metric({"event": "error", "error": self.last_error})
                self._failures += 1
                with self._cv:
                    self.phase = "retrying"  # a round that keeps failing does not spin; close() ends the wait
                    self._cv.wait_for(lambda: self._stop, min(MAX_WAIT_S, RETRY_WAIT_S * 2 ** (self._failures - 1)))
            finally:
                with self._cv:
                    self.phase = "idle"
                    self._in_round = []

    def _give_back(self, untrained: list[Sample], error: BaseException) -> bool:
        """A failed round's samples that no step trained go back to the front of the pool (caller holds the lock):
        nothing acknowledged is skipped. Samples the trainer refused (InvalidSamples) fail at once, each with its own
        error, and cost the others no try (True: the round failed for them alone); samples in MAX_TRIES failed
        rounds fail with the round's error, so a sample that always fails cannot stall the scenario (see `_fail`)."""
        refused = {s.record_id: error.errors[s.record_id] for s in untrained
                   if isinstance(error, InvalidSamples) and s.record_id in error.errors}
        back, failed = [], {}
        for s in untrained:
            if s.record_id in refused:
                failed[s.record_id] = (s, refused[s.record_id])
                continue
            if not refused:
                s.extra["failed_rounds"] = s.extra.get("failed_rounds", 0) + 1
            if s.extra.get("failed_rounds", 0) >= MAX_TRIES:
                failed[s.record_id] = (s, f"in {MAX_TRIES} failed rounds, the last: {type(error).__name__}: {error}")
            else:
                back.append(s)
        self._pool[:0] = back
        self.ledger.fail({rid: {"error": why, "rounds": s.extra.get("failed_rounds", 0), "records": s.record_ids,
                                "report": s.report_id} for rid, (s, why) in failed.items()},
                         consume=[rid for s, _ in failed.values() for rid in s.record_ids])
        return bool(refused)

    def _round(self, batch: list[Sample], dropped: list[Sample], manual: bool) -> None:
        if dropped:
            self.ledger.consume(rid for s in dropped for rid in s.record_ids)
        if not batch:
            return
        if self._reset:
            self._trainer, self._reset = None, False
        if self._trainer is None:
            serving = self.releaser.serving_release(self.scenario)
            self._trainer = self.recipe.make_trainer(self.engine.model_dir,
                                                     self.releaser.serving_folder(self.scenario, "weights"))
            self._trainer.steps = (serving or {}).get("trainer_step") or 0
        release_steps = self._release_steps()
        staleness = [self._trainer.steps - release_steps.get(s.release_id, 0) for s in batch]
        # An engine on the trainer's CPUs (a vLLM server here) stands aside for the step, which otherwise shares the
        # cores with it (results/train-beside-vllm.md)
        started = time.perf_counter()
        with self.engine.training_step() if isinstance(self.engine, YieldsToTraining) else nullcontext():
            metrics = self.recipe.train(self._trainer, batch)
        train_s = time.perf_counter() - started  # the whole round's training (a policy step's own: step_s)
        self.rounds += 1
        with self._cv:
            self._in_round = []  # trained: a later failure (export, evaluation) must not train them again
        self._since_candidate += batch  # consumed when a candidate is made from them (module docstring)
        self._metric({"event": "step", "trainer_step": self._trainer.steps, "manual": manual,
                      "dropped_stale": len(dropped), "staleness_mean": sum(staleness) / len(staleness),
                      "staleness_max": max(staleness), "train_s": round(train_s, 3),
                      "episode_samples": sum(1 for s in batch if s.loss_mask),
                      **{f"episodes_{k}": v for k, v in self.intake.episode_counts.items()},
                      **batch_report_means(batch), **metrics})
        if metrics.get("policy_step"):
            self._policy_steps_since_candidate += 1
        if self._policy_steps_since_candidate >= self.config.steps_per_candidate:
            self._policy_steps_since_candidate = 0
            self._candidate(metrics)

    # ---- candidates and releases (reef_lab.publishing.releaser) ---------------------------------------------
    def _candidate(self, metrics: dict) -> None:
        self.phase = "evaluating"
        used = list(self._since_candidate)  # they leave it once the candidate's lineage names them
        serving = self.releaser.serving_release(self.scenario)
        lineage = {"recipe": self.recipe.name, "config": _jsonable(self.config), "parent": (
            serving or {}).get("release_id", BASE), "records": [rid for s in used for rid in s.record_ids],
            "reports": sorted({s.report_id for s in used if s.report_id}), "trainer_step": self._trainer.steps,
            "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool))},
            **({"drops": list(self.recipe.absorbs)} if self.recipe.absorbs else {})}
        cid, folder = self.releaser.start_candidate(self.scenario, lineage)
        try:
            self._trainer.export(folder, {"scenario": self.scenario, "candidate": cid, **lineage})
        except Exception as e:  # the samples stay for the next candidate (and a restart trains them again)
            self.releaser.fail(self.scenario, cid, e, self._metric)
            raise
        self.ledger.consume(rid for s in used for rid in s.record_ids)
        self._since_candidate = self._since_candidate[len(used):]
        self.releaser.submit(self.scenario, cid, self.config.selection, self._eval_set(), log_row=self._metric,
                             retention=self._retention_set(), retention_tolerance=self.config.retention_tolerance)

    def publish(self, cid: str) -> dict:
        """Candidate -> release vN+1 through the releaser; on any failure the scenario stays on its release."""
        return self.releaser.release_candidate(self.scenario, cid, self._metric)

    def _eval_set(self) -> HeldOut | None:
        if self._task is None:
            return None
        if self._held_out is None:
            self._held_out = HeldOut(self._task, self._task.items(self.config.eval_size, self.config.eval_seed),
                                     self.config.eval_max_tokens)
        return self._held_out

    def _retention_set(self) -> HeldOut | None:
        if self._retention_task is None:
            return None
        if self._retention is None:
            self._retention = HeldOut(self._retention_task, self._retention_task.items(
                self.config.retention_size, self.config.eval_seed), self.config.retention_max_tokens)
        return self._retention

    @property
    def evaluates(self) -> bool:
        """Whether the recipe names a held-out task (candidates are scored and judged on it)."""
        return self._task is not None

    def evaluate_serving(self, retention: bool = False) -> dict:
        """Held-out accuracy of what serves now (computed once per release); `retention`: its retention task's too
        (kept beside it in the index: the base's `base_retention`), when the recipe config names one."""
        if not self._task:
            raise Conflict(f"scenario {self.scenario!r} has no eval_task in its recipe config")
        if retention and self._retention_task is not None:
            self.releaser.serving_eval(self.scenario, self._retention_set(), self._metric, key="retention")
        return self.releaser.serving_eval(self.scenario, self._eval_set(), self._metric)

    def _metric(self, row: dict) -> None:
        row = {"time": time.time(), "scenario": self.scenario, **row}
        with open(self.metrics_path, "ab") as f:
            f.write(orjson.dumps(row, default=str, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        if self.tracker is not None:
            self.tracker.log(row)


def _jsonable(config) -> dict:
    from dataclasses import asdict
    return orjson.loads(orjson.dumps(asdict(config), default=str))


def read_metrics(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    return [orjson.loads(line) for line in p.read_bytes().splitlines() if line.strip()]
