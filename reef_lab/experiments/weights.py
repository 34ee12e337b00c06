"""Experiments: a task stream driven through the gateway in-process, scored by the task's verifier, learned from.

The same code path as live traffic: each rollout is a chat completion through the gateway's inference (recorded,
with token ids and logprobs), its answer is scored by the task's verifier and reported through the gateway's
reports, and the scenario's learner trains, evaluates and releases exactly as it would behind the HTTP server. The
loop reaches them through its ExperimentContext (reef_lab.service), never the gateway.

    python scripts/run_experiment.py recipes/sao/examples/arithmetic.yaml

By default (`deterministic`) rollouts go in rounds of `max_pool`: a round's requests are made together, reported in
index order, and learned from before the next round starts, on an engine that decodes one request at a time, so the
same seed gives the same run bit for bit (results/reproducibility.md). With `deterministic: false` clients keep
`concurrency` requests in flight; while the learner's pool already holds `max_pool` unconsumed samples they wait
(backpressure), so rollouts are not made faster than training can use them and the staleness bound does not throw
the budget away. A run lives in `out_dir`: its data dir (records, releases, learner metrics),
`rollouts.jsonl` and `summary.json`. Running the same command again resumes: prompts already answered and reported
are skipped, and the learner replays reports it had not consumed.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from reef_lab.errors import ReefError
from reef_lab.experiments.driver import ExperimentDriver, RunConfig, choose_engine  # noqa: F401 (re-exported)
from reef_lab.learning.learner import read_metrics
from reef_lab.learning.recipe import load_recipe
from reef_lab.learning.heartbeat import Heartbeat
from reef_lab.tasks.base import TaskConfig, make_task
from reef_lab.wire.text import chat_message

log = logging.getLogger("reef_lab.experiments.weights")


@dataclass
class ExperimentConfig(RunConfig):
    recipe_config: dict = field(default_factory=dict, metadata={"help": "the recipe's config fields"})
    task: TaskConfig = field(default_factory=TaskConfig, metadata={
        "help": "reef_lab.tasks.base.TaskConfig fields"})
    rollouts: int = field(default=256, metadata={"help": "rollout budget: generations made and reported"})
    group_size: int = field(default=0, metadata={
        "help": "rollouts per prompt; 0: as many as the recipe compares (its rollouts_per_prompt: 1 for SAO, "
                "group_size for GRPO)"})
    concurrency: int = field(default=16, metadata={"help": "requests in flight"})
    max_pool: int = field(default=16, metadata={"help": "pause new requests while this many samples wait"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of rollouts"})
    max_tokens: int = field(default=32, metadata={"help": "max_tokens of each rollout"})
    final_eval: bool = field(default=True, metadata={"help": "score the serving release on the held-out set"})
    report_context: str = field(default="", metadata={
        "help": "each report's `context`, the words a self-distillation recipe (sdft, sdpo) learns from: this "
                "text with {answer} replaced by the item's reference answer (e.g. 'The answer is {answer}.'); "
                "empty: reports carry none"})
    harness: dict = field(default_factory=dict, metadata={
        "help": "a harness the scenario serves from the start (file name -> text, e.g. {system_prompt.md: ...}), "
                "published as its first release before any rollout: what context distillation (ctxd) distils. The "
                "base is then scored without it (base_accuracy) and with it (harness_accuracy); a weights release "
                "serves, and is judged, without it"})
    deterministic: bool = field(default=True, metadata={
        "help": "same seed, same run, bit for bit, whatever the machine's load: rollouts go in rounds of max_pool, "
                "each round's reports in index order, learned from (steps, candidate, release) before the next round "
                "starts, on an embedded engine that decodes one request at a time (a batch's make-up changes a row's "
                "last bits: results/reproducibility.md). false: rollouts stream while the learner trains (faster; "
                "runs differ in the last bits and in which release served a rollout near a release)"})

    def __post_init__(self) -> None:
        self.check_run()  # the task (a plug-in task resolved too), W&B, Hub and engine settings, before any model loads
        if self.deterministic and self.engine not in ("auto", "embedded"):
            raise ValueError(f"deterministic runs need the embedded engine (engine {self.engine!r} batches requests, "
                             "so a rollout's logprobs depend on what ran beside it): set engine: embedded, or "
                             "deterministic: false")
        if not isinstance(self.harness, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in self.harness.items()):
            raise ValueError("harness must map file names to their text, e.g. {system_prompt.md: ...}")
        if self.rollouts < 1 or self.group_size < 0 or self.concurrency < 1 or self.max_pool < 1:
            raise ValueError("rollouts, concurrency and max_pool must be at least 1, group_size at least 0")
        try:  # the recipe and its config are checked before any model loads
            compared = load_recipe(self.recipe, self.recipe_config).rollouts_per_prompt
        except ReefError as e:
            raise ValueError(e.message) from None
        if compared > 1 and self.group_size not in (0, compared):
            raise ValueError(f"group_size must equal the {compared} rollouts per prompt recipe {self.recipe!r} "
                             "compares; leave it at 0")
        self.group_size = self.group_size or compared
        if self.rollouts % self.group_size:
            raise ValueError(f"rollouts ({self.rollouts}) must be a multiple of group_size ({self.group_size})")

    @property
    def lora(self) -> bool:
        return int((self.recipe_config.get("trainer") or {}).get("lora_rank") or 0) > 0


def run_experiment(cfg: ExperimentConfig, engine=None, progress: bool = True) -> dict:
    """Run (or resume) an experiment; returns its summary. Its heartbeat (reef_lab.learning.heartbeat) tells the
    apps it runs while it writes nothing else."""
    with Heartbeat(cfg.run_dir):
        return WeightsExperiment(cfg, engine).run(progress)


class WeightsExperiment(ExperimentDriver):
    """Rollouts of a task stream through the gateway, scored by the task's verifier and reported; the scenario's
    weight learner trains, evaluates and releases as it would behind the server."""

    cfg: ExperimentConfig

    def __init__(self, cfg: ExperimentConfig, engine=None):
        super().__init__(cfg, engine, close_engine=True)

    def loop(self, progress: bool) -> dict:
        from tqdm import tqdm

        cfg = self.cfg
        if cfg.deterministic and cfg.engine == "auto":
            self.engine_name = "embedded"
        engine = self.build_engine(1 if cfg.deterministic else cfg.concurrency, cfg.lora)
        recipe_config = {**cfg.recipe_config}
        recipe_config["trainer"] = {"seed": cfg.seed, **(recipe_config.get("trainer") or {})}
        ctx = self.open(engine, recipe_config)
        started = time.time()
        name = cfg.name
        learner = ctx.learner()
        group_size = cfg.group_size
        task = make_task(cfg.task)
        prompts = task.items(cfg.rollouts // group_size, seed=cfg.seed)
        done = _reported_indices(ctx.reported())
        todo = [k for k in range(cfg.rollouts) if k not in done]
        # with a harness to serve first, the base alone is scored now, on the retention task too: every later
        # score of the base is with the harness in front (what serves then), and a release is compared with both
        base_eval = learner.evaluate_serving(retention=bool(cfg.harness)) \
            if learner.evaluates and not ctx.releases()["releases"] else None
        if cfg.harness and not ctx.releases()["releases"]:
            ctx.publish_harness(dict(cfg.harness), {"recipe": "experiment"})
            if learner.evaluates:
                learner.evaluate_serving()  # the base with the harness, kept on the harness release's entry
        rollouts_log = open(self.run_dir / "rollouts.jsonl", "ab")
        lock = threading.Lock()
        bar = tqdm(total=cfg.rollouts, initial=cfg.rollouts - len(todo), desc=f"{name} rollouts",
                   disable=not progress, dynamic_ncols=True)

        def rollout(k: int) -> tuple[int, dict, list[dict], float]:
            """Rollout k: one reply, or a tool task's whole episode (its calls one session), and its score."""
            item, records = prompts[k // group_size], []
            tags = {"exp_index": str(k)}
            if group_size > 1:
                tags["group"] = f"p{k // group_size}"

            def chat(messages: list[dict], tools: list[dict] | None) -> dict:
                body = {"model": engine.model_name, "messages": messages, "max_tokens": cfg.max_tokens,
                        "temperature": cfg.temperature, "seed": cfg.seed * 1_000_003 + k + 7_919 * len(records)}
                records.append(ctx.infer({**body, **({"tools": tools} if tools else {})}, tags,
                                         session=f"exp-{cfg.seed}-{k}"))
                return chat_message(records[-1])
            score, _ = task.rollout(chat, item)
            return k, item, records, score

        def one(k: int) -> None:
            while learner.status()["pool"] + learner.status()["inbox"] >= cfg.max_pool and learner.phase != "idle":
                time.sleep(0.05)
            report(*rollout(k))

        def report(k: int, item: dict, records: list[dict], score: float) -> None:
            words = {"context": cfg.report_context.replace("{answer}", str(item.get("answer")))} \
                if cfg.report_context else {}
            ctx.report({"score": score, "references": [r["id"] for r in records], "metadata": {"exp_index": k},
                        **words})
            with lock:
                rollouts_log.write(orjson.dumps({"k": k, "item": item["id"], "release": records[0]["release_id"],
                                                 "calls": len(records), "score": score, "time": time.time()}) + b"\n")
                rollouts_log.flush()
                bar.update(1)
                if bar.n % 16 == 0:
                    bar.set_postfix(_postfix(learner))

        with ThreadPoolExecutor(cfg.concurrency) as pool:
            if cfg.deterministic:
                for start in range(0, cfg.rollouts, cfg.max_pool):
                    round_ = [k for k in todo if start <= k < start + cfg.max_pool]
                    for done in sorted(pool.map(rollout, round_), key=lambda r: r[0]):  # reported in index order
                        report(*done)
                    learner.wait_idle(timeout=3600)  # its steps, candidate and release, before the next round
            else:
                list(pool.map(one, todo))
        bar.close()
        rollouts_log.close()
        learner.wait_idle(timeout=3600)
        ctx.wait_published(600)
        final_eval = learner.evaluate_serving() if cfg.final_eval and learner.evaluates else None
        releases = ctx.releases()
        failed = [c for c in releases["candidates"] if c.get("status") == "failed"]
        if failed:  # no summary.json: a comparison must not count a run that lost a candidate as finished
            raise ReefError(f"{len(failed)} candidate(s) of {name} failed ({failed[0]['id']}: {failed[0].get('error')}); "
                            f"serving kept {releases['serving'] or 'the base'}, but the run is incomplete: fix the cause "
                            f"(a full disk, say), remove {self.run_dir} and run the command again")
        base_eval = base_eval or releases.get("base_eval")
        first = releases["releases"][0] if cfg.harness and releases["releases"] else {}
        harness_eval = first.get("eval")  # the base with the harness, scored when it was published
        return {"name": name, "recipe": cfg.recipe, "seed": cfg.seed, "rollouts": cfg.rollouts,
                "base_accuracy": (base_eval or {}).get("accuracy"),
                **({"harness_accuracy": harness_eval["accuracy"]} if harness_eval else {}),
                "final_accuracy": (final_eval or {}).get("accuracy"),
                "serving": releases["serving"], "releases": len(releases["releases"]),
                "candidates": len(releases["candidates"]), "wall_s": round(time.time() - started, 1),
                "metrics_file": str(learner.metrics_path)}


def _reported_indices(reports: list[dict]) -> set[int]:
    done = set()
    for rec in reports:
        k = (rec.get("metadata") or {}).get("exp_index")
        if isinstance(k, int):
            done.add(k)
    return done


def _postfix(learner) -> dict:
    rows = read_metrics(learner.metrics_path)
    steps = [r for r in rows if r["event"] == "step"]
    cands = [r for r in rows if r["event"] == "candidate" and r.get("accuracy") is not None]
    out = {"step": steps[-1]["trainer_step"] if steps else 0}
    if steps:
        out["reward"] = round(steps[-1].get("reward_mean") or 0, 3)
    if cands:
        out["heldout"] = round(cands[-1]["accuracy"], 3)
    return out
