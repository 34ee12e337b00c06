"""The Slime trainer backend: a weight recipe's steps run by a slime job (Megatron on NVIDIA GPUs, under Ray).

Selected with `trainer: {backend: slime, options: {...}}` in a recipe's config; the recipe does not change. Written
against slime's source at commit 624b824a (https://github.com/THUDM/slime). It has NOT run end to end on reef_lab's
machines: they have no NVIDIA GPU, no Megatron and no Ray; what ran is in tests/test_slime_backend.py.

Why it is built this way. slime owns its training loop (`train.py`: generate a rollout, train on it, save, repeat),
its GPUs and its process groups, and it cannot run in reef_lab's serving process. Its extension points are
functions named on its command line. So this backend does not drive slime's internals: the recipe's learner calls
`step(samples, loss)` as with the torch trainer; the backend writes the batch (prompt and completion token ids, the
engine's logprob of each token, the report's score, the recipe's per-token advantages) as one file in a spool folder
and waits; a running slime job takes it through reef_lab's rollout hook (`--rollout-function-path
reef_lab.trainers.slime_hooks.generate_rollout`), trains one optimizer step on it, saves, and acknowledges it the next
time slime asks for a rollout. slime generates nothing itself: rollouts are what serving recorded, so the job runs
with `--debug-train-only` (no SGLang engines of slime's own, no weight sync) and reef_lab's SGLang engine serves the
results as releases. `export` turns the HF checkpoint slime writes for that rollout (`--save-hf`) into a release
folder the SGLang engine's `weights` transport loads: its safetensors, config and tokenizer, stamped with lineage.

The recipe's Loss, in slime's terms (fixed when the job is launched, so `trainer.options.loss` names it and a step
with another loss is refused):
- `nll` -> `--loss-type sft_loss` with `--calculate-per-token-loss`: the completion tokens' negative log-likelihood
  at `--rollout-temperature`, summed and divided by the step's token count, as the torch trainer does.
- `dis` -> `--loss-type policy_loss` with `--use-rollout-logprobs` (the ratio is to the engine's recorded logprob,
  as in DIS), the recipe's own per-token advantages (`--custom-advantage-function-path`, reading them from the
  spool), and `--eps-clip 1-dis_low --eps-clip-high dis_high-1`. Approximate: slime's loss is PPO's clipped
  surrogate, DIS masks. Tokens whose ratio left [dis_low, dis_high] get no gradient under DIS; under slime's clip
  those on the side the update would push back (ratio below dis_low with a positive advantage, above dis_high with a
  negative one) still do. slime reports no per-token mask counts, so the step's metrics carry none.
- `distill` (the opd recipe, divergence `reverse_kl`) -> slime's on-policy distillation, `--use-opd --opd-type
  megatron --opd-teacher-load <teacher> --opd-kl-coef <c>`, on `--loss-type policy_loss` with
  `--use-rollout-logprobs` and zero advantages from the spool: slime sets each token's advantage to
  -c (log mu(y) - log pi_teacher(y)) (mu the engine's recorded logprob) and the policy loss weighs it by the ratio
  pi / mu, clipped at `--eps-clip-high is_cap - 1` (no lower clip: `--eps-clip 1`). The torch trainer's reverse_kl
  is the same estimate with log pi (the policy now) in place of log mu and the ratio truncated, not clipped: equal on
  a fresh batch's first step, approximate after. The teacher is scored inside the job (a Megatron torch_dist
  checkpoint of the recipe's teacher folder, converted with slime's tools/convert_hf_to_torch_dist.py), so the step's
  metrics carry no teacher_gap. forward_kl / jsd over a top-K and self-distillation (sdft, sdpo: a teacher shown a
  context the student did not see) have no slime counterpart and are refused.

Not provided, and said so when asked: `logprobs` (slime's policy lives in the job; no recipe of reef_lab's calls it
today), `critic` (SAO's value model; slime's own critic, `--advantage-estimator ppo`, is not reef_lab's), LoRA
(slime's Megatron backend trains full weights), context parallelism (the advantage hook needs whole responses).
A job starts from one set of weights (`--load`, the serving release's HF folder): after a rollback or a restart on
another release the trainer refuses the running job and prints the command for a new one.

Launch on the GPU machine (docs/slime.md): `python -m reef_lab.trainers.slime --model-dir BASE [--init-folder
RELEASE] --trainer CONFIG` prints the `ray job submit ... train.py ...` command for the recipe's trainer config.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from reef_lab import procs
from reef_lab.trainers.samples import Sample
from reef_lab.schema import build, check_fields
from reef_lab.trainers.base import Critic, CriticConfig, DistillTrainer, Loss, TrainerConfig
from reef_lab.trainers.divergences import TABLE, divergence
from reef_lab.trainers.slime_hooks import (FORMAT, SLIME_LOSS, SPOOL_ENV, ack_path, job_path, last_step, read_json,
                                           step_path, write_json)

SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"  # the slime source this backend was written against
HOOKS = "reef_lab.trainers.slime_hooks"
# Model types whose HF weights slime loads into Megatron directly (`--load` an HF folder):
# slime/backends/megatron_utils/hf_to_megatron/__init__.py, _LOADERS, at SLIME_COMMIT.
HF_LOADABLE = ("deepseek_v3", "deepseek_v32", "glm4", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "kimi_k2", "llama",
               "mimo", "minimax_m2", "qwen2", "qwen2_moe", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_moe",
               "qwen3_next")
HEARTBEAT_STALE_S = 30.0  # a waiting job rewrites job.json every 5 s (slime_hooks.HEARTBEAT_S)
REEF_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SlimeConfig:
    slime_dir: str = field(default="", metadata={
        "help": "the slime checkout on the GPU machine (its train.py is run; reef_lab read commit 624b824a)"})
    megatron_dir: str = field(default="", metadata={
        "help": "the Megatron-LM checkout slime uses (put on PYTHONPATH); empty: Megatron is installed"})
    spool_dir: str = field(default="", metadata={
        "help": "a folder reef_lab and every slime rank can read and write (one per scenario): batches, "
                "acknowledgements, the job's state"})
    save_dir: str = field(default="", metadata={
        "help": "where slime saves: <save_dir>/megatron (--save) and <save_dir>/hf/rollout_<n> (--save-hf, "
                "what releases are made from)"})
    model_args_script: str = field(default="", metadata={
        "help": "one of slime's scripts/models/*.sh (defines MODEL_ARGS, Megatron's description of the model)"})
    model_args: list[str] = field(default_factory=list, metadata={
        "help": "Megatron model arguments given directly, instead of model_args_script"})
    ref_load: str = field(default="", metadata={
        "help": "a Megatron torch_dist checkpoint of the base (--ref-load); only for model types slime cannot load "
                "from HF weights, and then the job cannot start from a release"})
    ray_address: str = field(default="http://127.0.0.1:8265", metadata={"help": "ray job submit --address"})
    python: str = field(default="python3", metadata={"help": "the Python that runs slime's train.py in the job"})
    num_nodes: int = field(default=1, metadata={"help": "--actor-num-nodes"})
    gpus_per_node: int = field(default=1, metadata={"help": "--actor-num-gpus-per-node"})
    tensor_parallel: int = field(default=1, metadata={"help": "--tensor-model-parallel-size"})
    pipeline_parallel: int = field(default=1, metadata={"help": "--pipeline-model-parallel-size"})
    batch_size: int = field(default=16, metadata={
        "help": "samples per step: the recipe's batch size (--rollout-batch-size and --global-batch-size: one "
                "optimizer step per batch)"})
    loss: str = field(default="dis", metadata={"help": "the recipe's loss: dis (grpo, sao), nll (sft) or distill "
                                                       "(opd, slime's --use-opd)"})
    dis_low: float = field(default=0.3, metadata={"help": "the recipe's dis_low (--eps-clip 1 - dis_low)"})
    dis_high: float = field(default=5.0, metadata={"help": "the recipe's dis_high (--eps-clip-high dis_high - 1)"})
    opd_teacher_load: str = field(default="", metadata={
        "help": "loss distill: the teacher as a Megatron torch_dist checkpoint (--opd-teacher-load; convert the "
                "recipe's teacher folder with slime's tools/convert_hf_to_torch_dist.py)"})
    opd_kl_coef: float = field(default=1.0, metadata={"help": "loss distill: --opd-kl-coef, the weight of the "
                                                              "teacher's signal in each token's advantage"})
    is_cap: float = field(default=2.0, metadata={"help": "loss distill: the recipe's is_cap (--eps-clip-high "
                                                         "is_cap - 1)"})
    rollout_temperature: float = field(default=1.0, metadata={
        "help": "the temperature serving samples at; slime scores tokens at this one (--rollout-temperature)"})
    max_tokens_per_gpu: int = field(default=0, metadata={
        "help": "0: micro-batches of trainer.micro_batch_size samples; >0: slime's dynamic batching with this "
                "many tokens per GPU"})
    save_interval: int = field(default=1, metadata={
        "help": "save every N rollouts; a candidate needs a checkpoint of its step (1, or a divisor of "
                "steps_per_candidate)"})
    num_rollout: int = field(default=1_000_000, metadata={"help": "--num-rollout: steps before the job ends"})
    reef_lab_path: str = field(default="", metadata={
        "help": "where the job imports reef_lab from (PYTHONPATH); empty: this checkout"})
    env: dict = field(default_factory=dict, metadata={"help": "more environment variables for the job"})
    extra_args: list[str] = field(default_factory=list, metadata={
        "help": "more train.py arguments, as they are (e.g. --bf16, --attention-backend flash)"})
    connect_timeout_s: float = field(default=600.0, metadata={"help": "how long to wait for a job to be ready"})
    step_timeout_s: float = field(default=3600.0, metadata={"help": "how long one step may take in the job"})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.loss not in SLIME_LOSS:
            raise ValueError(f"loss must be one of {sorted(SLIME_LOSS)}, got {self.loss!r}")
        if not 0 < self.dis_low < 1 < self.dis_high:
            raise ValueError("the DIS interval needs 0 < dis_low < 1 < dis_high")
        if min(self.num_nodes, self.gpus_per_node, self.tensor_parallel, self.pipeline_parallel, self.batch_size,
               self.save_interval, self.num_rollout) < 1 or self.max_tokens_per_gpu < 0:
            raise ValueError("num_nodes, gpus_per_node, tensor_parallel, pipeline_parallel, batch_size, "
                             "save_interval and num_rollout must be >= 1, max_tokens_per_gpu >= 0")
        if (self.num_nodes * self.gpus_per_node) % (self.tensor_parallel * self.pipeline_parallel):
            raise ValueError(f"{self.num_nodes * self.gpus_per_node} GPUs do not split into tensor_parallel "
                             f"{self.tensor_parallel} x pipeline_parallel {self.pipeline_parallel} groups")
        if self.rollout_temperature <= 0 or self.connect_timeout_s <= 0 or self.step_timeout_s <= 0:
            raise ValueError("rollout_temperature, connect_timeout_s and step_timeout_s must be > 0")
        if self.loss == "distill" and not self.opd_teacher_load:
            raise ValueError("loss distill needs trainer.options.opd_teacher_load: the teacher as a Megatron torch_dist "
                             "checkpoint (convert the recipe's teacher folder with slime's "
                             "tools/convert_hf_to_torch_dist.py); slime scores it in the job")
        if not (self.is_cap >= 1 and math.isfinite(self.is_cap)) or not (self.opd_kl_coef > 0 and
                                                                          math.isfinite(self.opd_kl_coef)):
            raise ValueError("is_cap must be a finite number >= 1 and opd_kl_coef a finite number > 0")
        if self.model_args and self.model_args_script:
            raise ValueError("give model_args or model_args_script, not both")


def check_trainer_config(cfg: TrainerConfig) -> SlimeConfig:
    """The slime settings of a trainer config, refusing what slime cannot do with the reason and the fix."""
    sc = build(SlimeConfig, cfg.options, "trainer.options")
    if cfg.lora_rank:
        raise ValueError("the slime backend trains full weights (slime's Megatron backend has no LoRA): set "
                         "trainer.lora_rank 0, and serve with the sglang engine's weights transport")
    if cfg.device not in ("auto", "cuda"):
        raise ValueError(f"the slime backend trains on the job's GPUs: trainer.device must be auto or cuda, got "
                         f"{cfg.device!r}")
    dp = sc.num_nodes * sc.gpus_per_node // (sc.tensor_parallel * sc.pipeline_parallel)
    if not sc.max_tokens_per_gpu and sc.batch_size % (cfg.micro_batch_size * dp):
        raise ValueError(f"trainer.options.batch_size {sc.batch_size} must be a multiple of micro_batch_size "
                         f"{cfg.micro_batch_size} x {dp} data-parallel ranks (or set trainer.options.max_tokens_per_gpu "
                         "for dynamic batching)")
    return sc


def read_model_args(script: str | Path) -> list[str]:
    """MODEL_ARGS of one of slime's scripts/models/*.sh, as bash expands it."""
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(f"model args script {script} does not exist: name one of slime's "
                                "scripts/models/*.sh (e.g. scripts/models/qwen2.5-0.5B.sh) in "
                                "trainer.options.model_args_script")
    out = procs.run(["bash", "-c", 'source "$1" >/dev/null && printf "%s\\0" "${MODEL_ARGS[@]}"', "_",
                     str(script)], capture_output=True, text=True, check=False)
    args = [a for a in out.stdout.split("\0") if a]
    if out.returncode or not args:
        raise ValueError(f"{script} does not define MODEL_ARGS (bash said: {out.stderr.strip()[:300]})")
    return args


def _real(path) -> str:
    return os.path.realpath(path)


def launch_argv(model_dir: str | Path, config: TrainerConfig, init_folder: str | Path | None = None,
                check_paths: bool = True) -> list[str]:
    """The `ray job submit ... train.py ...` command of a slime job that trains this trainer config's steps, starting
    from `init_folder` (a release's HF folder) or the base in `model_dir`. `check_paths`: the paths exist here (run
    it on the machine that launches the job)."""
    sc = check_trainer_config(config)
    for name in ("slime_dir", "spool_dir", "save_dir"):
        if not getattr(sc, name):
            help_text = SlimeConfig.__dataclass_fields__[name].metadata["help"]
            raise ValueError(f"trainer.options.{name} is required: {help_text}")
    load = Path(init_folder) if init_folder is not None else Path(model_dir)
    if check_paths:
        _check_paths(sc, Path(model_dir), init_folder)
    model_args = sc.model_args or (read_model_args(sc.model_args_script) if sc.model_args_script else [])
    if not model_args:
        raise ValueError("trainer.options needs Megatron's description of the model: model_args_script (one of slime's "
                         "scripts/models/*.sh) or model_args")
    spool, save = _real(sc.spool_dir), _real(sc.save_dir)
    pythonpath = ":".join(p for p in (sc.megatron_dir, sc.slime_dir, sc.reef_lab_path or str(REEF_ROOT)) if p)
    env = {"PYTHONPATH": pythonpath, "CUDA_DEVICE_MAX_CONNECTIONS": "1", SPOOL_ENV: spool, **sc.env}
    b1, b2 = config.betas
    if sc.max_tokens_per_gpu:
        batching = ["--use-dynamic-batch-size", "--max-tokens-per-gpu", str(sc.max_tokens_per_gpu)]
    else:
        batching = ["--micro-batch-size", str(config.micro_batch_size)]
    if sc.loss == "nll":
        loss = ["--loss-type", "sft_loss", "--disable-compute-advantages-and-returns"]
    else:
        low, high = (1.0, sc.is_cap - 1) if sc.loss == "distill" else (1 - sc.dis_low, sc.dis_high - 1)
        loss = ["--loss-type", "policy_loss", "--advantage-estimator", "grpo",
                "--custom-advantage-function-path", f"{HOOKS}.advantages", "--disable-rewards-normalization",
                "--use-rollout-logprobs", "--eps-clip", str(low), "--eps-clip-high", str(high)]
        if sc.loss == "distill":
            loss += ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", _real(sc.opd_teacher_load),
                     "--opd-kl-coef", str(sc.opd_kl_coef)]
    train = [
        "--actor-num-nodes", str(sc.num_nodes), "--actor-num-gpus-per-node", str(sc.gpus_per_node),
        "--debug-train-only",  # rollouts come from reef_lab's records: slime starts no SGLang engines of its own
        "--hf-checkpoint", _real(model_dir), "--load", _real(load),
        *(["--ref-load", _real(sc.ref_load)] if sc.ref_load else []),
        "--save", f"{save}/megatron", "--save-interval", str(sc.save_interval), "--no-save-optim",
        "--save-hf", f"{save}/hf/rollout_{{rollout_id}}",
        "--disable-rollout-global-dataset", "--rollout-function-path", f"{HOOKS}.generate_rollout",
        "--custom-rm-path", f"{HOOKS}.reward",
        "--num-rollout", str(sc.num_rollout), "--rollout-batch-size", str(sc.batch_size),
        "--n-samples-per-prompt", "1", "--global-batch-size", str(sc.batch_size),
        "--rollout-temperature", str(sc.rollout_temperature),
        "--tensor-model-parallel-size", str(sc.tensor_parallel),
        "--pipeline-model-parallel-size", str(sc.pipeline_parallel), "--context-parallel-size", "1",
        "--optimizer", "adam", "--lr", str(config.lr), "--lr-decay-style", "constant",
        "--weight-decay", str(config.weight_decay), "--adam-beta1", str(b1), "--adam-beta2", str(b2),
        "--clip-grad", str(config.max_grad_norm), "--seed", str(config.seed),
        "--calculate-per-token-loss", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
        *batching, *loss,
        "--train-env-vars", json.dumps({SPOOL_ENV: spool}),
        *model_args, *sc.extra_args]
    return ["ray", "job", "submit", "--address", sc.ray_address, "--runtime-env-json", json.dumps({"env_vars": env}),
            "--", sc.python, str(Path(sc.slime_dir) / "train.py"), *train]


def _check_paths(sc: SlimeConfig, model_dir: Path, init_folder) -> None:
    if not (Path(sc.slime_dir) / "train.py").is_file():
        raise FileNotFoundError(f"no slime checkout at {sc.slime_dir!r} (no train.py there): git clone "
                                f"https://github.com/THUDM/slime (reef_lab read commit {SLIME_COMMIT[:8]}) and set "
                                "trainer.options.slime_dir to it")
    if sc.megatron_dir and not Path(sc.megatron_dir).is_dir():
        raise FileNotFoundError(f"trainer.options.megatron_dir {sc.megatron_dir!r} does not exist: clone Megatron-LM "
                                "there, or leave it empty if Megatron is installed")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a Hugging Face model folder (no config.json): slime reads the "
                                "base's config and tokenizer from it (--hf-checkpoint)")
    model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    if model_type not in HF_LOADABLE:
        if not sc.ref_load:
            raise ValueError(f"slime loads HF weights only for model types {list(HF_LOADABLE)}, not {model_type!r}: "
                             "give trainer.options.ref_load (a torch_dist checkpoint made with slime's "
                             "tools/convert_hf_to_torch_dist.py)")
        if init_folder is not None:
            raise ValueError(f"slime cannot load a release's HF weights for model type {model_type!r}, so this "
                             "scenario cannot resume from its release on slime")
    if init_folder is not None and not any(Path(init_folder).glob("*.safetensors")):
        raise FileNotFoundError(f"release folder {init_folder} holds no .safetensors weights to start from")


def expected_job(model_dir: str | Path, config: TrainerConfig, init_folder: str | Path | None) -> dict:
    """What a job launched with `launch_argv(model_dir, config, init_folder)` reports about itself
    (slime_hooks.job_summary), for the keys this trainer depends on."""
    sc = check_trainer_config(config)
    out = {"hf_checkpoint": _real(model_dir), "load": _real(init_folder if init_folder is not None else model_dir),
           "loss_type": SLIME_LOSS[sc.loss], "rollout_temperature": sc.rollout_temperature,
           "global_batch_size": sc.batch_size, "save_hf": f"{_real(sc.save_dir)}/hf/rollout_{{rollout_id}}",
           "save_interval": sc.save_interval, "context_parallel_size": 1, "use_opd": sc.loss == "distill"}
    if sc.loss == "dis":
        out.update(eps_clip=1 - sc.dis_low, eps_clip_high=sc.dis_high - 1, use_rollout_logprobs=True,
                   custom_advantage_function_path=f"{HOOKS}.advantages")
    elif sc.loss == "distill":
        out.update(eps_clip=1.0, eps_clip_high=sc.is_cap - 1, use_rollout_logprobs=True,
                   custom_advantage_function_path=f"{HOOKS}.advantages", opd_type="megatron",
                   opd_teacher_load=_real(sc.opd_teacher_load), opd_kl_coef=sc.opd_kl_coef)
    return out


def launch_hint(model_dir, config: TrainerConfig, init_folder) -> str:
    """The command that prints the launch command (run on the GPU machine)."""
    parts = ["python", "-m", "reef_lab.trainers.slime", "--model-dir", str(model_dir)]
    if init_folder is not None:
        parts += ["--init-folder", str(init_folder)]
    return shlex.join(parts + ["--trainer", json.dumps(asdict(config))])


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


class SlimeTrainer(DistillTrainer):
    """Steps run by a slime job through the spool (see the module docstring)."""

    @classmethod
    def check_config(cls, config: TrainerConfig) -> None:
        """`trainer.options` are a SlimeConfig; what slime cannot do is refused with the reason and the fix."""
        check_trainer_config(config)

    def __init__(self, model_dir: str | Path, config: TrainerConfig | None = None,
                 init_folder: str | Path | None = None):
        self.config = config or TrainerConfig(backend="slime")
        self.slime = check_trainer_config(self.config)
        if not self.slime.spool_dir:
            raise ValueError("trainer.options.spool_dir is required: the folder the slime job reads batches from")
        self.model_dir = Path(model_dir)
        self.init_folder = Path(init_folder) if init_folder is not None else None
        self.spool = Path(self.slime.spool_dir)
        self.steps = 0
        self.trained: dict | None = None  # the acknowledgement of the last step slime trained
        self.teacher: str | None = None  # loss distill: the teacher the recipe named (scored in the job)
        self.job = self._connect()

    def _hint(self) -> str:
        return launch_hint(self.model_dir, self.config, self.init_folder)

    def _connect(self) -> dict:
        """The job waiting on the spool, once it is ready and was launched for this trainer."""
        expected = expected_job(self.model_dir, self.config, self.init_folder)
        deadline = time.monotonic() + self.slime.connect_timeout_s
        job = None
        while time.monotonic() < deadline:
            if job_path(self.spool).is_file():
                job = read_json(job_path(self.spool))
                wrong = [k for k in expected if not _same(expected[k], job.get(k))]
                if wrong:
                    raise ValueError(
                        f"the slime job on spool {self.spool} (job {job.get('job_id')} on {job.get('host')}) was "
                        f"launched for another trainer: " + "; ".join(
                            f"{k} is {job.get(k)!r}, this trainer needs {expected[k]!r}" for k in wrong) +
                        f". Stop it (ray job stop) and launch one with the command printed by: {self._hint()}")
                fresh = time.time() - job.get("time", 0) < HEARTBEAT_STALE_S
                if job.get("state") == "waiting" and fresh and job.get("seq") == last_step(self.spool) + 1:
                    return job
            time.sleep(0.2)
        state = "no job.json" if job is None else f"job.json says {job.get('state')} step {job.get('seq')}"
        raise TimeoutError(f"no slime job is waiting on spool {self.spool} after {self.slime.connect_timeout_s:.0f} s "
                           f"({state}): launch one on the GPU machine with the command printed by: {self._hint()}")

    def _check(self, samples: list[Sample], loss: Loss) -> None:
        sc = self.slime
        if not isinstance(loss, Loss):
            raise TypeError(f"the slime backend runs only the built-in losses (reef_lab.trainers.base.Loss), not "
                            f"{type(loss).__name__}: a recipe's own loss needs trainer.backend torch")
        if loss.kind != sc.loss or (loss.kind == "dis" and (loss.dis_low, loss.dis_high) != (sc.dis_low,
                                                                                          sc.dis_high)):
            raise ValueError(f"the recipe asks for {loss}, but the slime job was launched for loss {sc.loss!r} "
                             f"(dis_low {sc.dis_low}, dis_high {sc.dis_high}): set trainer.options.loss, dis_low and "
                             "dis_high to the recipe's and relaunch")
        if loss.kind == "distill" and (not divergence(loss.divergence).slime or loss.is_cap != sc.is_cap):
            runs = ", ".join(d.name for d in TABLE.values() if d.slime)
            raise ValueError(f"the recipe asks for {loss}; slime's on-policy distillation runs {runs} (the reverse "
                             f"KL on the sampled token) with is_cap {sc.is_cap}: set the recipe's divergence to it and "
                             "trainer.options.is_cap to its is_cap, and relaunch")
        if len(samples) != sc.batch_size:
            raise ValueError(f"the recipe's batch holds {len(samples)} samples, the slime job steps on "
                             f"trainer.options.batch_size {sc.batch_size}: set it to the recipe's batch size")
        for s in samples:
            if abs(s.temperature - sc.rollout_temperature) > 1e-6:
                raise ValueError(f"sample {s.record_id} was sampled at temperature {s.temperature}, the slime job "
                                 f"scores at {sc.rollout_temperature}: set trainer.options.rollout_temperature")
            if loss.kind == "distill" and s.logprobs is None:
                raise ValueError(f"sample {s.record_id}: on-policy distillation needs the engine's logprobs")
            if loss.kind == "dis" and (s.logprobs is None or len(s.advantages or []) !=
                                       len(s.completion_ids)):
                raise ValueError(f"sample {s.record_id}: the dis loss needs the engine's logprobs and an advantage "
                                 "per completion token (Sample.advantages)")

    def step(self, samples: list[Sample], loss: Loss) -> dict:
        """Spool the batch, wait until slime trained on it; metrics (slime keeps its loss and grad norm in its own
        logs: they are not reported here)."""
        started = time.perf_counter()
        self._check(samples, loss)
        job = read_json(job_path(self.spool))
        seq = last_step(self.spool) + 1
        if job.get("job_id") != self.job["job_id"] or job.get("state") != "waiting" or job.get("seq") != seq:
            raise RuntimeError(f"the slime job on spool {self.spool} is not waiting for step {seq} (job "
                               f"{job.get('job_id')}: {job.get('state')} step {job.get('seq')}): one trainer per "
                               f"spool; relaunch the job with the command printed by: {self._hint()}")
        write_json(step_path(self.spool, seq), {
            "format": FORMAT, "seq": seq, "job_id": self.job["job_id"], "trainer_step": self.steps + 1,
            "loss": asdict(loss), "teacher": self.teacher, "samples": [_spooled(s, loss) for s in samples]})
        ack = self._wait_for_ack(seq)
        self.steps += 1
        self.trained = ack
        tokens = sum(len(s.completion_ids) for s in samples)
        return {"tokens": tokens, "samples": len(samples), "step_s": round(time.perf_counter() - started, 3),
                "slime_rollout_id": ack["rollout_id"], "slime_train_s": ack.get("train_s")}

    def _wait_for_ack(self, seq: int) -> dict:
        deadline = time.monotonic() + self.slime.step_timeout_s
        while time.monotonic() < deadline:
            if ack_path(self.spool, seq).is_file():
                ack = read_json(ack_path(self.spool, seq))
                if not ack.get("trained"):
                    raise RuntimeError(f"the slime job refused step {seq}: {ack.get('error')}")
                return ack
            job = read_json(job_path(self.spool))
            if job.get("state") == "waiting" and time.time() - job.get("time", 0) > HEARTBEAT_STALE_S:
                raise RuntimeError(f"the slime job on spool {self.spool} stopped before taking step {seq} (no "
                                   f"heartbeat for {HEARTBEAT_STALE_S:.0f} s): see `ray job logs`, then relaunch with "
                                   f"the command printed by: {self._hint()}")
            time.sleep(0.2)
        raise TimeoutError(f"slime did not finish step {seq} within {self.slime.step_timeout_s:.0f} s (spool "
                           f"{self.spool}): see `ray job logs` of job {self.job['job_id']}")

    def export(self, folder: str | Path, metadata: dict) -> Path:
        """The HF checkpoint slime saved after the last step, as a release folder (release_from_checkpoint)."""
        if self.trained is None:
            raise RuntimeError("this slime trainer has not trained a step yet: there is no checkpoint to export")
        checkpoint = self.trained.get("hf_checkpoint")
        if checkpoint is None:
            raise FileNotFoundError(
                f"slime saved no HF checkpoint for rollout {self.trained['rollout_id']} (it saves every "
                f"{self.slime.save_interval} rollouts into {self.slime.save_dir}/hf): set trainer.options.save_interval "
                "to 1 or a divisor of the recipe's steps_per_candidate")
        meta = {"trainer": "slime", "trainer_config": asdict(self.config), "trainer_step": self.steps,
                "base_model_dir": str(self.model_dir),
                "slime": {"job_id": self.job["job_id"], "rollout_id": self.trained["rollout_id"],
                          "checkpoint": checkpoint, "source_read_at": SLIME_COMMIT,
                          **({"teacher": self.teacher} if self.teacher else {})}, **metadata}
        return release_from_checkpoint(checkpoint, folder, self.model_dir, meta)

    def logprobs(self, samples: list[Sample], base: bool = False) -> list[list[float]]:
        raise NotImplementedError(
            "the slime backend cannot compute logprobs: the policy lives in the slime job, which takes batches only "
            "through its rollout hook. A recipe that needs the policy's or the base's logprobs (e.g. a KL term) "
            "runs on trainer.backend torch")

    def score_teacher(self, samples: list[Sample], teacher_dir: str | Path | None,
                      teacher_release: str | Path | None = None, top_k: int = 0,
                      prompts: list[list[int]] | None = None) -> None:
        """Nothing is scored here: the job scores the teacher it was launched with (--opd-teacher-load) on the
        student's own tokens in its training forward pass. What slime cannot do is refused."""
        if self.slime.loss != "distill":
            raise ValueError(f"this slime job was launched for loss {self.slime.loss!r}, not on-policy distillation: "
                             "set trainer.options.loss distill and opd_teacher_load, and relaunch")
        if top_k:
            raise ValueError("slime's on-policy distillation is the reverse KL on the sampled token; a divergence "
                             "over the teacher's top-K (forward_kl, jsd) needs trainer.backend torch")
        if prompts is not None:
            raise ValueError("slime's teacher reads the student's own prompt: a teacher shown another context "
                             "(context distillation) needs trainer.backend torch")
        self.teacher = str(teacher_release or teacher_dir)

    def score_self(self, samples: list[Sample], prompts: list[list[int]], top_k: int = 0, ema: float = 0.0) -> None:
        raise ValueError("self-distillation (sdft, sdpo) scores the policy with a context the student did not see; "
                         "slime's on-policy distillation has a separate, fixed teacher: run it on trainer.backend "
                         "torch, or opd with a teacher checkpoint on slime")

    def critic(self, config: CriticConfig) -> Critic:
        raise NotImplementedError(
            "the slime backend has no reef_lab value model: slime's own critic (--advantage-estimator ppo) is not "
            "driven by reef_lab. Run sao on trainer.backend torch; grpo and sft run on slime")


def _spooled(s: Sample, loss: Loss) -> dict:
    return {"record_id": s.record_id, "report_id": s.report_id, "release_id": s.release_id,
            "prompt_ids": list(s.prompt_ids), "completion_ids": list(s.completion_ids),
            "logprobs": list(s.logprobs) if s.logprobs is not None else None, "score": s.score,
            "temperature": s.temperature, "group": s.group, "loss_mask": list(s.mask),
            "advantages": list(s.advantages) if loss.kind == "dis" else
            [0.0] * len(s.completion_ids) if loss.kind == "distill" else None}  # distill: slime adds the teacher's


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _tensor_shapes(files: list[Path]) -> dict[str, list[int]]:
    from safetensors import SafetensorError, safe_open

    shapes = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    shapes[k] = list(st.get_slice(k).get_shape())
        except (SafetensorError, OSError) as e:
            raise ValueError(f"checkpoint file {f} cannot be read: {e}") from e
    return shapes


def release_from_checkpoint(checkpoint: str | Path, folder: str | Path, base_model_dir: str | Path,
                            metadata: dict) -> Path:
    """Copy the HF folder slime saved (`--save-hf`: safetensors shards, their index, and the config and tokenizer
    files slime copies from --hf-checkpoint) into the release `folder`, after checking its tensors are the base
    model's (names and shapes), fill in any config or tokenizer file it lacks from the base, and stamp it with
    `metadata` (reef_lab.checkpoints.stamp_checkpoint), as every engine loads it."""
    from reef_lab.checkpoints import stamp_checkpoint

    src, base, folder = Path(checkpoint), Path(base_model_dir), Path(folder)
    if not src.is_dir():
        raise FileNotFoundError(f"slime checkpoint {src} does not exist: give the folder slime wrote with --save-hf "
                                "(trainer.options.save_dir/hf/rollout_<n>)")
    weights = sorted(src.glob("*.safetensors"))
    if not weights:
        raise ValueError(f"{src} holds no .safetensors weights: give slime's --save-hf folder, or convert a Megatron "
                         "torch_dist checkpoint first with slime's tools/convert_torch_dist_to_hf.py")
    if not (src / "config.json").is_file() and not (base / "config.json").is_file():
        raise FileNotFoundError(f"neither {src} nor the base {base} has a config.json")
    index = src / "model.safetensors.index.json"
    if index.is_file():
        named = set(json.loads(index.read_text())["weight_map"].values())
        if named != {w.name for w in weights}:
            raise ValueError(f"{index} names shards {sorted(named)}, the folder holds {[w.name for w in weights]}")
    elif len(weights) > 1:
        raise ValueError(f"{src} holds {len(weights)} safetensors shards but no model.safetensors.index.json")
    have = _tensor_shapes(weights)
    want = _tensor_shapes(sorted(base.glob("*.safetensors")))
    if want:
        base_config = json.loads((base / "config.json").read_text())
        tied = {"lm_head.weight"} if base_config.get("tie_word_embeddings") else set()
        missing, unknown = sorted(set(want) - set(have) - tied), sorted(set(have) - set(want) - tied)
        if missing or unknown:
            raise ValueError(f"{src} is not a checkpoint of the base {base}: missing {missing[:5]}, unknown "
                             f"{unknown[:5]} (was --hf-checkpoint this base?)")
        for k in set(have) & set(want):
            if have[k] != want[k]:
                raise ValueError(f"{src}: {k} has shape {have[k]}, the base {want[k]}")
    folder.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.is_file():
            shutil.copy2(f, folder / f.name)
    for f in sorted(base.iterdir()):  # config and tokenizer files slime did not copy (never weights)
        if (f.is_file() and not (folder / f.name).exists() and f.name not in WEIGHT_INDEXES
                and not f.name.endswith(WEIGHT_SUFFIXES) and f.name != "reef_checkpoint.json"):
            shutil.copy2(f, folder / f.name)
    stamp_checkpoint(folder, metadata)
    return folder


def main(argv: list[str] | None = None) -> None:
    """Print the launch command of the slime job for a recipe's trainer config (run on the GPU machine)."""
    import yaml

    p = argparse.ArgumentParser(prog="python -m reef_lab.trainers.slime", description=main.__doc__)
    p.add_argument("--model-dir", required=True, help="the base model's HF folder (the engine's model_dir)")
    p.add_argument("--init-folder", help="the serving release's folder to start from (none: the base)")
    p.add_argument("--trainer", required=True, help="the trainer config: inline YAML/JSON or a YAML file; a recipe "
                                                   "config file works too (its `trainer` mapping is used)")
    p.add_argument("--no-check", action="store_true", help="do not check that the paths exist on this machine")
    a = p.parse_args(argv)
    text = Path(a.trainer).read_text() if Path(a.trainer).is_file() else a.trainer
    try:  # JSON first: PyYAML reads JSON's 1e-05 as a string
        data = json.loads(text)
    except json.JSONDecodeError:
        data = yaml.safe_load(text)
    if isinstance(data, dict) and isinstance(data.get("trainer"), dict):
        data = data["trainer"]
    cfg = build(TrainerConfig, data, "trainer")
    print(shlex.join(launch_argv(a.model_dir, cfg, a.init_folder, check_paths=not a.no_check)))


if __name__ == "__main__":
    main()
