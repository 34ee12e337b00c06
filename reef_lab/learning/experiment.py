"""Experiments: a task stream driven through the gateway in-process, scored by the task's verifier, learned from.

The same code path as live traffic: each rollout is a chat completion through `Gateway.infer` (recorded, with
token ids and logprobs), its answer is scored by the task's verifier and reported with `Gateway.report`, and the
scenario's learner trains, evaluates and releases exactly as it would behind the HTTP server.

    python scripts/run_experiment.py recipes/sao/examples/arithmetic.yaml

Clients keep `concurrency` requests in flight; while the learner's pool already holds `max_pool` unconsumed samples
they wait (backpressure), so rollouts are not made faster than training can use them and the staleness bound does
not throw the budget away. A run lives in `out_dir`: its data dir (records, releases, learner metrics),
`rollouts.jsonl`, `summary.json` and `heartbeat.json` (refreshed while it runs). Running the same command again
resumes: prompts already answered and reported are skipped, and the learner replays reports it had not consumed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from reef_lab.errors import ReefError
from reef_lab.gateway.gateway import Gateway
from reef_lab.learning.heartbeat import Heartbeat
from reef_lab.learning.learner import read_metrics
from reef_lab.learning.recipe import load_recipe
from reef_lab.learning.tasks import make_task
from reef_lab.procs import Popen

log = logging.getLogger("reef_lab.learning.experiment")


@dataclass
class ExperimentConfig:
    name: str = field(default="experiment", metadata={"help": "run name (also the scenario's name)"})
    recipe: str = field(default="sao", metadata={"help": "recipe: a folder in recipes/ or module:Class"})
    recipe_config: dict = field(default_factory=dict, metadata={"help": "the recipe's config fields"})
    task: dict = field(default_factory=dict, metadata={"help": "reef_lab.learning.tasks.TaskConfig fields"})
    rollouts: int = field(default=256, metadata={"help": "rollout budget: generations made and reported"})
    group_size: int = field(default=0, metadata={
        "help": "rollouts per prompt; 0: as many as the recipe compares (its rollouts_per_prompt: 1 for SAO, "
                "group_size for GRPO)"})
    concurrency: int = field(default=16, metadata={"help": "requests in flight"})
    max_pool: int = field(default=16, metadata={"help": "pause new requests while this many samples wait"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of rollouts"})
    max_tokens: int = field(default=32, metadata={"help": "max_tokens of each rollout"})
    seed: int = field(default=0, metadata={"help": "seed of the training prompts, sampling and the trainer"})
    model_path: str | None = field(default=None, metadata={"help": "model to train (default: embedded SmolLM2)"})
    engine: str = field(default="auto", metadata={
        "help": "the engine that generates the rollouts: auto (vllm when `bash scripts/setup.sh --vllm` has installed "
                "it, the model is the default one and the recipe trains LoRA, which vLLM's weight reload needs; "
                "else embedded), embedded, vllm or module:Class (reef_lab.engines)"})
    engine_options: dict = field(default_factory=dict, metadata={"help": "the engine's own settings"})
    out_dir: str | None = field(default=None, metadata={"help": "run folder (default: runs/<name>-seed<seed>)"})
    final_eval: bool = field(default=True, metadata={"help": "score the serving release on the held-out set"})
    wandb: dict = field(default_factory=dict, metadata={
        "help": "reef_lab.publishing.tracking.TrackingConfig fields (project, entity, group, mode); the run is named after the "
                "experiment and seed, grouped by the experiment's name"})
    hub: dict = field(default_factory=dict, metadata={
        "help": "publish releases to the Hub: reef_lab.publishing.hub.HubConfig fields, e.g. {repo: me/reef-{scenario}}"})

    def __post_init__(self) -> None:
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
    def run_dir(self) -> Path:
        return Path(self.out_dir or f"runs/{self.name}-seed{self.seed}")


def choose_engine(cfg: ExperimentConfig) -> tuple[str, str]:
    """`engine: auto`: the fastest rollout path this machine has for the run (results/engines.md: vLLM CPU
    generates 3.5x the embedded engine's tokens/s at 32 concurrent), and why."""
    from reef_lab.engines.vllm import DEFAULT_PYTHON

    lora = int((cfg.recipe_config.get("trainer") or {}).get("lora_rank") or 0) > 0
    if not DEFAULT_PYTHON.is_file():
        return "embedded", "vLLM is not installed: bash scripts/setup.sh --vllm"
    if cfg.model_path is not None:
        return "embedded", "model_path is set; name engine: vllm to serve it with vLLM"
    if not lora:
        return "embedded", "the recipe trains full weights; vLLM's in-place reload needs trainer.lora_rank > 0"
    return "vllm", "installed in .venv-vllm, default model, LoRA training"


def run_experiment(cfg: ExperimentConfig, engine=None, progress: bool = True) -> dict:
    """Run (or resume) an experiment; returns its summary. Its heartbeat (reef_lab.learning.heartbeat) tells the
    apps it runs while it writes nothing else."""
    with Heartbeat(cfg.run_dir):
        return _run_experiment(cfg, engine, progress)


def _run_experiment(cfg: ExperimentConfig, engine, progress: bool) -> dict:
    from tqdm import tqdm

    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    engine_name = cfg.engine  # config.json keeps what was asked (auto); the log says what auto chose
    if engine is None and cfg.engine == "auto":
        engine_name, why = choose_engine(cfg)
        log.info("rollouts on the %s engine (%s)", engine_name, why)
    (run_dir / "config.json").write_bytes(orjson.dumps(asdict(cfg), option=orjson.OPT_INDENT_2))
    if engine is None:
        from reef_lab.config import ServeConfig
        from reef_lab.engines import engine_class

        serve = ServeConfig(engine=engine_name, model_path=cfg.model_path, max_batch=max(cfg.concurrency, 1),
                            engine_options=orjson.dumps(cfg.engine_options).decode() if cfg.engine_options else None)
        engine = engine_class(engine_name).from_config(serve)
    from reef_lab.publishing.hub import HubConfig

    hub = HubConfig(**cfg.hub) if cfg.hub.get("repo") else None
    from reef_lab.publishing.tracking import TrackingConfig

    tracking = TrackingConfig(**{"group": cfg.name, "name": f"{cfg.name}-seed{cfg.seed}",
                                 "extra_config": {"experiment": asdict(cfg)}, **cfg.wandb})
    gw = Gateway(run_dir / "data", engine, default_recipe="basic", hub=hub, tracking=tracking,
                 allowed_recipes=[cfg.recipe])
    started = time.time()
    try:
        name = cfg.name
        recipe_config = {**cfg.recipe_config}
        recipe_config.setdefault("trainer", {})
        recipe_config["trainer"] = {"seed": cfg.seed, **recipe_config["trainer"]}
        if name not in {s.name for s in gw.scenarios.list()}:
            gw.create_scenario({"name": name, "recipe": cfg.recipe, "config": recipe_config}, operator=True)
        learner = gw.learner(name)
        group_size = cfg.group_size
        task = make_task(cfg.task)
        prompts = task.items(cfg.rollouts // group_size, seed=cfg.seed)
        done = _reported_indices(gw, name)
        todo = [k for k in range(cfg.rollouts) if k not in done]
        base_eval = learner.evaluate_serving() if learner.evaluates and not gw.releases.index(name)["releases"] \
            else None
        rollouts_log = open(run_dir / "rollouts.jsonl", "ab")
        lock = threading.Lock()
        bar = tqdm(total=cfg.rollouts, initial=cfg.rollouts - len(todo), desc=f"{name} rollouts",
                   disable=not progress, dynamic_ncols=True)

        def one(k: int) -> None:
            while learner.status()["pool"] + learner.status()["inbox"] >= cfg.max_pool and learner.phase != "idle":
                time.sleep(0.05)
            item = prompts[k // group_size]
            body = {"model": engine.model_name, "messages": item["messages"], "max_tokens": cfg.max_tokens,
                    "temperature": cfg.temperature, "seed": cfg.seed * 1_000_003 + k}
            tags = {"exp_index": str(k)}
            if group_size > 1:
                tags["group"] = f"p{k // group_size}"
            reply = gw.infer("openai.chat", body, name, tags=tags)
            text = orjson.loads(reply.body)["choices"][0]["message"]["content"]
            score = task.score(item, text)
            receipt = reply.headers["x-reef-agent-record-id"]
            gw.report(name, {"score": score, "references": [receipt], "metadata": {"exp_index": k}})
            with lock:
                rollouts_log.write(orjson.dumps({"k": k, "item": item["id"], "release": reply.headers[
                    "x-reef-release-id"], "score": score, "time": time.time()}) + b"\n")
                rollouts_log.flush()
                bar.update(1)
                if bar.n % 16 == 0:
                    bar.set_postfix(_postfix(learner))

        with ThreadPoolExecutor(cfg.concurrency) as pool:
            list(pool.map(one, todo))
        bar.close()
        rollouts_log.close()
        learner.wait_idle(timeout=3600)
        if gw.hub is not None:
            gw.hub.wait(timeout=600)
        final_eval = learner.evaluate_serving() if cfg.final_eval and learner.evaluates else None
        idx = gw.releases.index(name)
        base_eval = base_eval or idx.get("base_eval")
        summary = {"name": name, "recipe": cfg.recipe, "seed": cfg.seed, "rollouts": cfg.rollouts,
                   "base_accuracy": (base_eval or {}).get("accuracy"),
                   "final_accuracy": (final_eval or {}).get("accuracy"),
                   "serving": gw.list_releases(name)["serving"], "releases": len(idx["releases"]),
                   "candidates": len(idx["candidates"]), "wall_s": round(time.time() - started, 1),
                   "metrics_file": str(learner.metrics_path)}
        (run_dir / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
        return summary
    finally:
        gw.close()


def launch_detached(config: str | Path, seed: int, out_dir: str | Path, overrides: dict | None = None,
                    root: str | Path | None = None) -> Popen:
    """Start `scripts/run_experiment.py <config> --seed N --out DIR [--set k=v ...]` as a detached child whose
    output goes to `<out_dir>/run.log` and whose pid goes to `<out_dir>/run.pid`: the apps launch runs this way so
    a run outlives the notebook. Each override is written as YAML reads it back (3e-05 as 3.0e-05: YAML takes
    `3e-05` for a string).

    Detached on purpose, unlike every other child reef_lab starts: a run has a budget and ends by itself, it
    resumes where it stopped, and its results are what the user came for, so closing the browser tab or restarting
    the notebook's kernel must not throw away an hour of training; the app finds it again by its folder and pid.
    What the run starts (a vLLM server) dies with the run, `kill -9` included (reef_lab.procs), and
    `kill()` on the handle, or SIGTERM to the pid in run.pid, stops the run and everything below it."""
    root = Path(root) if root else Path(__file__).resolve().parents[2]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(root / "scripts/run_experiment.py"), str(config), "--seed", str(seed),
           "--out", str(out_dir)]
    for key, value in (overrides or {}).items():
        cmd += ["--set", f"{key}={yaml_value(value)}"]
    with open(out_dir / "run.log", "ab") as log:
        proc = Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root, detached=True)
    (out_dir / "run.pid").write_text(f"{proc.child_pid}\n")
    return proc


def yaml_value(value) -> str:
    """`value` as YAML text that reads back as the same value (`--set key=<this>`)."""
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, width=10**9).removesuffix("...\n").strip()


def run_choices(found: list[str], launched: str | None = None) -> list[str]:
    """The folders an app offers, each once: $REEF_LAB_RUN first (how `marimo run apps/<app>.py` is pointed at
    one), then the run this session launched, then those `found` on disk."""
    env = os.environ.get("REEF_LAB_RUN")
    return list(dict.fromkeys(([env] if env else []) + ([launched] if launched else []) + found))


def _reported_indices(gw: Gateway, name: str) -> set[int]:
    done = set()
    for rec in gw.store.get_many(gw.store.ids(name, "report")):
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


def run_weight_experiment(data: dict, progress: bool = True) -> dict:
    """A weight recipe's experiment from its YAML mapping (scripts/run_experiment.py)."""
    return run_experiment(ExperimentConfig(**data), progress=progress)
