"""The Slime trainer backend (reef_lab/trainers/slime.py, reef_lab/trainers/slime_hooks.py), tested without slime.

slime (https://github.com/THUDM/slime) needs NVIDIA GPUs, Megatron and Ray and is not on the package index, so it
never runs here. What is tested is everything on reef_lab's side of it, against slime's source at commit
624b824a898ab0ec1fcb4d373004c7f3852bf515:
- the hooks on slime `Sample`s: `slime.utils.types` is replaced by a stand-in that reproduces the `Sample` dataclass
  field for field (slime/utils/types.py at that commit: names, order, defaults, the `Status` enum and the nested
  `SpecInfo` / `PrefixCacheInfo`), and `slime.rollout.base_types.RolloutFnTrainOutput` likewise
  (slime/rollout/base_types.py); the samples are then checked the way slime's
  `RolloutManager._convert_samples_to_train_data` (slime/ray/rollout.py) reads them;
- the launch command: every flag is one slime's parser defines (SLIME_FLAGS, taken from slime/utils/arguments.py at
  that commit: every `add_argument` / `reset_arg`) or Megatron's (MEGATRON_FLAGS, NVIDIA/Megatron-LM
  megatron/training/arguments.py at d98e8a64), and what the job would parse from it is what the trainer expects;
- the checkpoint slime writes with --save-hf (sharded safetensors, an index, the base's config and tokenizer, as
  slime/backends/megatron_utils/hf_checkpoint_saver.py writes them) becoming a release that the SGLang engine loads
  with its `weights` transport, with the checkpoint's weights;
- bad inputs, each refused with the fix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from reef_lab.trainers import losses
from reef_lab.trainers.samples import Sample as ReefSample
from reef_lab.trainers import slime_hooks as hooks
from reef_lab.trainers import make_trainer, trainer_class
from reef_lab.trainers.base import Loss, TrainerConfig
from reef_lab.trainers.slime import (SlimeTrainer, check_trainer_config, expected_job, launch_argv, main,
                                     read_model_args, release_from_checkpoint)

ROOT = Path(__file__).resolve().parents[1]

# Every flag slime's parser defines: slime/utils/arguments.py at 624b824a (add_argument and reset_arg calls;
# --train-backend and the --debug-* flags are parsed first, in _pre_parse_mode).
SLIME_FLAGS = {"--" + f for f in """
    actor-num-gpus-per-node actor-num-nodes advantage-estimator allgather-cp apply-chat-template
    apply-chat-template-kwargs async-save balance-by-flops balance-data buffer-filter-path
    calculate-per-token-loss check-weight-update-equal ci-disable-kl-checker ci-load-grad-norm ci-save-grad-norm
    ci-test ci-train-rollout-logprob-abs-diff-threshold clip-grad colocate custom-advantage-function-path
    custom-config-path custom-convert-samples-to-train-data-path custom-eval-rollout-log-function-path
    custom-generate-function-path custom-loss-function-path custom-megatron-before-log-prob-hook-path
    custom-megatron-before-train-step-hook-path custom-megatron-init-path custom-model-provider-path
    custom-pg-loss-reducer-function-path custom-reward-post-process-path custom-rm-path
    custom-rollout-log-function-path custom-tis-function-path custom-update-weight-post-write-path
    data-pad-size-multiplier data-source-path debug-rollout-only debug-train-only
    disable-compute-advantages-and-returns disable-grpo-std-normalization disable-rewards-normalization
    disable-rollout-global-dataset disable-wandb-random-suffix distributed-backend distributed-timeout-minutes
    dump-details dynamic-sampling-filter-path enable-mtp-training entropy-coef eps-clip eps-clip-c eps-clip-high
    eval-config eval-function-path eval-input-key eval-interval eval-label-key eval-max-context-len
    eval-max-prompt-len eval-max-response-len eval-min-new-tokens eval-prompt-data eval-reward-key
    eval-temperature eval-tool-key eval-top-k eval-top-p fetch-trajectory-retry-times freeze-indexer
    freeze-params-name-list gamma get-mismatch-metrics global-batch-size group-rm hf-checkpoint http-proxy
    input-key keep-old-actor kl-coef kl-loss-coef kl-loss-type label-key lambd load load-debug-rollout-data
    load-debug-rollout-data-subsample load-forge-rollout-data log-correct-samples log-multi-turn log-passrate
    log-probs-chunk-size log-probs-max-tokens-per-gpu log-reward-category loss-mask-type loss-type lr
    mask-offpolicy-in-partial-rollout max-tokens-per-gpu megatron-config-path megatron-deepgemm-forward-layers
    megatron-deepgemm-forward-modules megatron-deepgemm-moe-forward-layers megatron-deepgemm-moe-forward-modules
    memory-recorder memory-snapshot-dir memory-snapshot-num-steps metadata-key micro-batch-size
    min-batch-collection-ratio model-name mtp-loss-scaling-factor mtp-num-layers multimodal-keys
    n-samples-per-eval-prompt n-samples-per-prompt no-save-optim normalize-advantages num-critic-only-steps
    num-epoch num-gpus-per-node num-rollout num-steps-per-rollout offload offload-rollout offload-train
    only-train-params-name-list opd-kl-coef opd-teacher-ckpt-step opd-teacher-load opd-type opsm-delta
    over-sampling-batch-size padded-vocab-size partial-rollout profile-target prompt-data qwen-gdn-backend
    recompute-loss-function record-memory-history ref-ckpt-step ref-load ref-update-interval release-train
    reset-optimizer-states reward-key rm-type rm-url rollout-all-samples-process-path rollout-batch-size
    rollout-buffer-url rollout-data-postprocess-path rollout-data-transport rollout-external-engine-addrs
    rollout-function-path rollout-health-check-first-wait rollout-health-check-interval
    rollout-health-check-timeout rollout-max-context-len rollout-max-prompt-len rollout-max-response-len
    rollout-num-gpus rollout-num-gpus-per-engine rollout-sample-filter-path rollout-sample-hook-path
    rollout-seed rollout-shuffle rollout-skip-special-tokens rollout-stop rollout-stop-token-ids
    rollout-task-type rollout-temperature rollout-top-k rollout-top-p save save-debug-rollout-data
    save-debug-train-data save-hf save-interval seed skip-eval-before-train start-rollout-id tb-experiment-name
    tb-project-name tis-clip tis-clip-low tool-key train-backend train-env-vars update-weight-buffer-size
    update-weight-delta-checksum update-weight-delta-encoding update-weight-disk-dir
    update-weight-disk-keep-files update-weight-local-checkpoint-dir update-weight-mode update-weight-transport
    update-weights-interval use-distributed-post use-dynamic-batch-size use-fault-tolerance use-kl-loss use-opd
    use-opsm use-rollout-entropy use-rollout-logprobs use-rollout-routing-replay use-routing-replay
    use-stateless-adam use-tensorboard use-tis use-unbiased-kl use-wandb value-clip wandb-always-use-train-step
    wandb-dir wandb-group wandb-host wandb-key wandb-mode wandb-project wandb-run-id wandb-team
""".split()}
# The Megatron flags the launch command uses beyond those: NVIDIA/Megatron-LM megatron/training/arguments.py at
# d98e8a64: --optimizer, --weight-decay, --adam-beta1, --adam-beta2 are add_argument calls; the others are dataclass
# fields made flags by ArgumentGroupFactory: TransformerConfig (with ModelParallelConfig's fields) for the
# parallel sizes and dropouts, SchedulerConfig for --lr-decay-style.
MEGATRON_FLAGS = {"--optimizer", "--weight-decay", "--adam-beta1", "--adam-beta2", "--tensor-model-parallel-size",
                  "--pipeline-model-parallel-size", "--context-parallel-size", "--attention-dropout",
                  "--hidden-dropout", "--lr-decay-style"}
# slime's scripts/models/qwen2.5-0.5B.sh at 624b824a, as it is (Megatron's description of a model).
MODEL_SCRIPT = """MODEL_ARGS=(
   --swiglu
   --num-layers 24
   --hidden-size 896
   --ffn-hidden-size 4864
   --num-attention-heads 14
   --use-rotary-position-embeddings
   --disable-bias-linear
   --add-qkv-bias
   --normalization "RMSNorm"
   --norm-epsilon 1e-6
   --rotary-base 1000000
   --group-query-attention
   --num-query-groups 2
   --vocab-size 151936
)
"""


# ---- the stand-in for slime's types (slime/utils/types.py and slime/rollout/base_types.py at 624b824a) ------------
@dataclass
class SlimeSample:
    """The sample generated"""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    rollout_routed_experts: list[list[int]] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING

    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)


SLIME_SAMPLE_FIELDS = [  # slime/utils/types.py at 624b824a, in order
    "group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs", "multimodal_train_inputs",
    "multimodal_train_input_id", "apply_chat_template_kwargs", "response", "response_length", "label", "reward",
    "loss_mask", "weight_versions", "rollout_log_probs", "rollout_top_p_token_ids", "rollout_top_p_token_offsets",
    "rollout_routed_experts", "remove_sample", "teacher_log_probs", "status", "metadata", "generate_function_path",
    "custom_rm_path", "train_metadata", "session_id", "non_generation_time", "spec_info", "prefix_cache_info"]


@dataclass
class RolloutFnTrainOutput:
    samples: list[list[SlimeSample]]
    metrics: dict[str, Any] = None


@pytest.fixture
def slime_standin(monkeypatch, tmp_path):
    """slime's modules in sys.modules (nothing else of slime exists here), a spool folder in the environment and
    the hooks' per-process state cleared."""
    mods = {name: ModuleType(name) for name in ("slime", "slime.utils", "slime.utils.types", "slime.rollout",
                                                "slime.rollout.base_types")}
    mods["slime.utils.types"].Sample = SlimeSample
    mods["slime.rollout.base_types"].RolloutFnTrainOutput = RolloutFnTrainOutput
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    spool = tmp_path / "spool"
    monkeypatch.setenv(hooks.SPOOL_ENV, str(spool))
    hooks._JOB.clear()
    hooks._ADVANTAGES.clear()
    yield spool
    hooks._JOB.clear()
    hooks._ADVANTAGES.clear()


def train_data_like_slime(groups) -> dict:
    """What slime's RolloutManager reads from a rollout function's output (slime/ray/rollout.py at 624b824a:
    `_get_rollout_data` flattens the groups, `_convert_samples_to_train_data` asserts and collects), reduced to the
    fields reef_lab sets."""
    data = groups
    while isinstance(data[0], list):
        data = [s for g in data for s in g]
    for s in data:
        assert len(s.loss_mask) == s.response_length, "loss mask length != response length"
        if s.rollout_log_probs is not None:
            assert len(s.rollout_log_probs) == s.response_length
    out = {"tokens": [s.tokens for s in data], "response_lengths": [s.response_length for s in data],
           "rewards": [s.reward for s in data], "loss_masks": [s.loss_mask for s in data],
           "sample_indices": [s.index for s in data],
           "truncated": [1 if s.status == SlimeSample.Status.TRUNCATED else 0 for s in data]}
    if data[0].rollout_log_probs is not None:
        out["rollout_log_probs"] = [s.rollout_log_probs for s in data]
    return out


# ---- helpers ------------------------------------------------------------------------------------------------------
def fake_slime_checkout(tmp_path: Path) -> Path:
    checkout = tmp_path / "slime"
    (checkout / "scripts" / "models").mkdir(parents=True)
    (checkout / "train.py").write_text("# stands in for slime's train.py: launch_argv only checks it is there\n")
    (checkout / "scripts" / "models" / "qwen2.5-0.5B.sh").write_text(MODEL_SCRIPT)
    return checkout


def slime_settings(tmp_path: Path, **kw) -> dict:
    checkout = tmp_path / "slime" if (tmp_path / "slime").is_dir() else fake_slime_checkout(tmp_path)
    return {"slime_dir": str(checkout), "spool_dir": str(tmp_path / "spool"), "save_dir": str(tmp_path / "save"),
            "model_args_script": str(checkout / "scripts" / "models" / "qwen2.5-0.5B.sh"), "batch_size": 4,
            "connect_timeout_s": 20.0, "step_timeout_s": 60.0, **kw}


def trainer_config(tmp_path: Path, **kw) -> TrainerConfig:
    return TrainerConfig(backend="slime", micro_batch_size=2, lr=2e-6, options=slime_settings(tmp_path, **kw))


def job_args(argv: list[str]) -> argparse.Namespace:
    """The fields the hooks read, parsed from the launch command the way slime's parser would (types and defaults
    of slime/utils/arguments.py at 624b824a; eps_clip_high defaults to eps_clip as in slime_validate_args)."""
    p = argparse.ArgumentParser(allow_abbrev=False)
    for name in ("--hf-checkpoint", "--load", "--save-hf", "--custom-advantage-function-path",
                 "--rollout-function-path", "--custom-rm-path"):
        p.add_argument(name, default=None)
    p.add_argument("--loss-type", default="policy_loss")
    p.add_argument("--eps-clip", type=float, default=0.2)
    p.add_argument("--eps-clip-high", type=float, default=None)
    p.add_argument("--use-rollout-logprobs", action="store_true")
    p.add_argument("--rollout-temperature", type=float, default=1.0)
    p.add_argument("--global-batch-size", type=int, default=None)
    p.add_argument("--save-interval", type=int, default=None)
    p.add_argument("--context-parallel-size", type=int, default=1)
    p.add_argument("--use-opd", action="store_true")
    p.add_argument("--opd-type", choices=["sglang", "megatron"], default=None)
    p.add_argument("--opd-teacher-load", default=None)
    p.add_argument("--opd-kl-coef", type=float, default=1.0)
    args, _ = p.parse_known_args(argv[argv.index("--") + 3:])
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    return args


def reef_samples(n_groups=2, per_group=2, temperature=1.0) -> list[ReefSample]:
    out = []
    for g in range(n_groups):
        for j in range(per_group):
            k = g * per_group + j
            completion = [100 + k, 200 + k, 300 + k][: 2 + (k % 2)]
            s = ReefSample(record_id=f"rec_{k}", prompt_ids=[1, 50 + g, 60 + g], completion_ids=completion,
                           logprobs=[-0.5 - 0.1 * i for i in range(len(completion))], score=float(k % 2),
                           release_id="base", temperature=temperature, group=f"prompt-{g}", report_id=f"rep_{k}",
                           loss_mask=[1, 0, 1] if k == 1 else None)  # rec_1 is episode-shaped: a given token
            s.advantages = [0.25 * (k - 1.5) + 0.01 * i for i in range(len(completion))]
            out.append(s)
    return out


class Thread:
    """A hook call on its own thread, as slime's RolloutManager makes it; its result or error is kept."""

    def __init__(self, fn, *args):
        self.result, self.error = None, None

        def run():
            try:
                self.result = fn(*args)
            except BaseException as e:  # noqa: BLE001 - the test reads it
                self.error = e
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout=30):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the call did not finish"
        return self


def slime_hf_save(model_dir: Path, state: dict[str, torch.Tensor], out: Path) -> None:
    """An HF checkpoint as slime's --save-hf writes one: safetensors shards model-0000i-of-0000n with
    model.safetensors.index.json, beside every non-weight file of --hf-checkpoint (config, tokenizer, ...)."""
    out.mkdir(parents=True)
    names = sorted(state)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: state[k].contiguous() for k in shard}, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
         "weight_map": weight_map}))
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            (out / f.name).write_bytes(f.read_bytes())


def release_tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


# ---- the tests ----------------------------------------------------------------------------------------------------
def test_the_stand_in_has_slimes_sample_fields():
    assert [f.name for f in fields(SlimeSample)] == SLIME_SAMPLE_FIELDS
    assert [s.value for s in SlimeSample.Status] == ["pending", "completed", "truncated", "aborted", "failed"]


@pytest.fixture
def sglang_double(tiny_model_dir):
    from reef_lab.engines.embedded import EmbeddedEngine
    from reef_lab.testing.sglang_server import SGLangDouble, SGLangDoubleServer

    inner = EmbeddedEngine.from_path(str(tiny_model_dir), max_batch=2)
    server = SGLangDoubleServer(SGLangDouble(inner, tiny_model_dir))
    yield server, inner
    server.shutdown()
    inner.close()


def stop_waiting_hook(spool: Path, call: Thread) -> None:
    """End a hook call that waits for the next batch: a batch for another job, which the hook refuses."""
    seq = hooks.last_step(spool) + 1
    hooks.write_json(hooks.step_path(spool, seq), {"format": hooks.FORMAT, "seq": seq, "job_id": "another-job",
                                                   "loss": {"kind": "dis"}, "samples": []})
    call.join()
    assert isinstance(call.error, ValueError) and "one reef_lab trainer and one slime job per spool" in str(call.error)
    assert "another-job" in json.loads(hooks.ack_path(spool, seq).read_text())["error"]


def test_a_step_goes_through_the_hooks_and_its_checkpoint_serves_on_sglang(slime_standin, tmp_path, tiny_model,
                                                                          tiny_model_dir, sglang_double):
    from reef_lab.engines.sglang import SGLangEngine

    spool, cfg = slime_standin, trainer_config(tmp_path)
    args = job_args(launch_argv(tiny_model_dir, cfg))
    first = Thread(hooks.generate_rollout, args, 0, None)  # slime's first rollout: the job waits for a batch
    trainer = SlimeTrainer(tiny_model_dir, cfg)  # finds the waiting job, launched for it
    batch = reef_samples()
    step = Thread(trainer.step, batch, Loss("dis"))
    out = first.join().result
    assert first.error is None and isinstance(out, RolloutFnTrainOutput)
    groups = out.samples  # list[list[Sample]], one list per prompt (the recipe's group)
    assert [[s.metadata["reef_lab"]["record_id"] for s in g] for g in groups] == [["rec_0", "rec_1"],
                                                                                 ["rec_2", "rec_3"]]
    assert [s.group_index for g in groups for s in g] == [0, 0, 1, 1]
    assert all(isinstance(s, SlimeSample) and s.status is SlimeSample.Status.COMPLETED for g in groups for s in g)
    data = train_data_like_slime(groups)
    assert data["tokens"] == [s.prompt_ids + s.completion_ids for s in batch]
    assert data["response_lengths"] == [len(s.completion_ids) for s in batch]
    assert data["loss_masks"] == [s.mask for s in batch] and data["loss_masks"][1] == [1, 0, 1]
    assert data["rollout_log_probs"] == [s.logprobs for s in batch]
    assert data["rewards"] == [s.score for s in batch] and data["truncated"] == [0, 0, 0, 0]
    assert len(set(data["sample_indices"])) == 4 and out.metrics["reef_lab/step"] == 1
    assert json.loads((spool / "job.json").read_text())["state"] == "training"

    # on the training ranks: the recipe's own per-token advantages, found by each sample's index
    rollout_data = {"sample_indices": data["sample_indices"],
                    "kl": [torch.zeros(n) for n in data["response_lengths"]]}
    hooks.advantages(args, rollout_data)
    for a, s in zip(rollout_data["advantages"], batch, strict=True):
        assert torch.allclose(a, torch.tensor(s.advantages))
    assert rollout_data["returns"] is rollout_data["advantages"]

    # slime trains, saves (--save-hf) and asks for the next rollout, which acknowledges the step
    trained = {k: v + 0.01 for k, v in tiny_model.state_dict().items()}
    slime_hf_save(tiny_model_dir, trained, Path(args.save_hf.format(rollout_id=0)))
    second = Thread(hooks.generate_rollout, args, 1, None)
    metrics = step.join().result
    assert step.error is None, step.error
    assert metrics["samples"] == 4 and metrics["tokens"] == sum(len(s.completion_ids) for s in batch)
    assert metrics["slime_rollout_id"] == 0 and trainer.steps == 1
    assert losses.dis_metrics(metrics) == {}  # slime counts no masked tokens: none are reported

    release = trainer.export(tmp_path / "release", {"scenario": "s", "candidate": "c1"})
    got = release_tensors(release)
    assert set(got) == set(trained) and all(torch.equal(got[k], trained[k]) for k in trained)
    meta = json.loads((release / "reef_checkpoint.json").read_text())
    assert meta["trainer"] == "slime" and meta["trainer_step"] == 1 and meta["candidate"] == "c1"
    assert meta["slime"]["rollout_id"] == 0 and meta["slime"]["checkpoint"].endswith("rollout_0")
    assert (release / "config.json").is_file() and (release / "tokenizer.json").is_file()

    server, inner = sglang_double  # the SGLang engine serves it as full weights (pause, update from disk, continue)
    engine = SGLangEngine(server.url, tiny_model_dir, transport="weights")
    engine.load_release("s:v1", release)
    engine.route("s", "s:v1")
    assert server.app.weights == "weights:s:v1" and "/update_weights_from_disk" in server.app.calls
    served = inner._models["weights:s:v1"].state_dict()
    assert all(torch.equal(served[k].cpu(), trained[k]) for k in trained)

    with pytest.raises(ValueError, match="trainer.options.loss"):  # the job was launched for dis
        trainer.step(batch, Loss("nll"))
    stop_waiting_hook(spool, second)


def test_a_step_without_a_saved_checkpoint_cannot_be_exported(slime_standin, tmp_path, tiny_model_dir):
    spool, cfg = slime_standin, trainer_config(tmp_path, loss="nll", save_interval=2)
    args = job_args(launch_argv(tiny_model_dir, cfg))
    first = Thread(hooks.generate_rollout, args, 0, None)
    trainer = SlimeTrainer(tiny_model_dir, cfg)
    with pytest.raises(RuntimeError, match="has not trained a step yet"):
        trainer.export(tmp_path / "r", {})
    batch = [ReefSample(record_id=f"demo_{i}", prompt_ids=[1, 2], completion_ids=[3, 4, 5], logprobs=None,
                        score=None, release_id="base") for i in range(4)]
    step = Thread(trainer.step, batch, Loss("nll"))
    groups = first.join().result.samples
    data = train_data_like_slime(groups)
    assert "rollout_log_probs" not in data and data["rewards"] == [0.0] * 4  # sft: no logprobs, demonstrations
    assert [len(g) for g in groups] == [1, 1, 1, 1]  # ungrouped records: one prompt each
    second = Thread(hooks.generate_rollout, args, 1, None)  # slime saved nothing for rollout 0 (interval 2)
    assert step.join().error is None
    with pytest.raises(FileNotFoundError, match="save_interval"):
        trainer.export(tmp_path / "r", {})
    stop_waiting_hook(spool, second)


def test_opd_runs_on_slime_as_its_on_policy_distillation(slime_standin, tmp_path, tiny_model_dir):
    from reef_lab.learning.distill import DistillConfig, ResolvedTeacher, distill_step

    teacher = tmp_path / "teacher_torch_dist"
    teacher.mkdir()
    spool, cfg = slime_standin, trainer_config(tmp_path, loss="distill", opd_teacher_load=str(teacher))
    args = job_args(launch_argv(tiny_model_dir, cfg))
    first = Thread(hooks.generate_rollout, args, 0, None)
    trainer = SlimeTrainer(tiny_model_dir, cfg)
    batch = reef_samples()
    for s in batch:
        s.advantages = None  # opd's samples carry no advantage: slime makes it from the teacher's logprobs
    step = Thread(distill_step, trainer, batch, DistillConfig(batch_size=4), ResolvedTeacher(
        tiny_model_dir, None, "calculator:v3"))
    groups = first.join().result.samples
    data = train_data_like_slime(groups)
    assert data["rollout_log_probs"] == [s.logprobs for s in batch]  # the OPD term's log mu
    rollout_data = {"sample_indices": data["sample_indices"],
                    "kl": [torch.zeros(n) for n in data["response_lengths"]]}
    hooks.advantages(args, rollout_data)  # zero: slime then subtracts opd_kl_coef * (log mu - log pi_teacher)
    assert [a.tolist() for a in rollout_data["advantages"]] == [[0.0] * len(s.completion_ids) for s in batch]
    spooled = json.loads(hooks.step_path(spool, 1).read_text())
    assert spooled["teacher"] == str(tiny_model_dir) and spooled["loss"]["kind"] == "distill"
    second = Thread(hooks.generate_rollout, args, 1, None)
    metrics = step.join().result
    assert step.error is None, step.error
    assert metrics["policy_step"] and metrics["samples"] == 4 and "teacher_gap" not in metrics  # scored in the job

    # what slime's OPD cannot do is refused, naming the fix
    with pytest.raises(ValueError, match="top-K.*trainer.backend torch"):
        distill_step(trainer, batch, DistillConfig(batch_size=4, divergence="forward_kl"),
                     ResolvedTeacher(tiny_model_dir, None, "t"))
    with pytest.raises(ValueError, match="self-distillation"):
        distill_step(trainer, batch, DistillConfig(batch_size=4), None, prompts=[s.prompt_ids for s in batch])
    with pytest.raises(ValueError, match="another context"):
        trainer.score_teacher(batch, tiny_model_dir, prompts=[s.prompt_ids for s in batch])
    with pytest.raises(ValueError, match="trainer.options.is_cap"):
        trainer.step(batch, Loss("distill", is_cap=3.0))
    with pytest.raises(ValueError, match="opd_teacher_load"):
        check_trainer_config(trainer_config(tmp_path, loss="distill"))
    stop_waiting_hook(spool, second)


def test_the_reward_hook_returns_the_reports_score(slime_standin):
    batch = {"loss": {"kind": "nll"}, "samples": [
        {"record_id": "a", "prompt_ids": [1], "completion_ids": [2, 3], "score": 0.75, "temperature": 1.0},
        {"record_id": "b", "prompt_ids": [1], "completion_ids": [4], "score": None, "temperature": 1.0}]}
    (a,), (b,) = hooks.samples_from_batch(batch, 7, SlimeSample)
    assert asyncio.run(hooks.reward(None, a)) == 0.75 and asyncio.run(hooks.reward(None, b)) == 0.0
    assert asyncio.run(hooks.reward(None, [a, b])) == [0.75, 0.0]  # --group-rm: a whole group
    assert a.index == 7 * hooks.INDEX_STRIDE and b.index == 7 * hooks.INDEX_STRIDE + 1
    with pytest.raises(ValueError, match="reef_lab's rollout hook"):
        asyncio.run(hooks.reward(None, SlimeSample(tokens=[1, 2], response_length=1)))


def test_the_advantage_hook_needs_whole_responses(slime_standin):
    hooks.write_json(hooks.step_path(slime_standin, 3), {"samples": [{"advantages": [0.5, 0.5, 0.5]}]})
    rollout_data = {"sample_indices": [3 * hooks.INDEX_STRIDE], "kl": [torch.zeros(2)]}  # a CP rank's slice
    with pytest.raises(ValueError, match="--context-parallel-size 1"):
        hooks.advantages(None, rollout_data)


def test_the_launch_command_uses_slimes_and_megatrons_flags(tmp_path, tiny_model_dir):
    import importlib
    import os

    checkout = fake_slime_checkout(tmp_path)
    model_args = read_model_args(checkout / "scripts" / "models" / "qwen2.5-0.5B.sh")
    assert model_args[:3] == ["--swiglu", "--num-layers", "24"] and model_args[-2:] == ["--vocab-size", "151936"]
    release = tmp_path / "release"
    release.mkdir()
    (release / "model.safetensors").write_bytes((tiny_model_dir / "model.safetensors").read_bytes())
    teacher = tmp_path / "teacher_torch_dist"
    teacher.mkdir()
    for loss, init in (("dis", None), ("nll", release), ("distill", None)):
        cfg = trainer_config(tmp_path, loss=loss, **({"opd_teacher_load": str(teacher), "is_cap": 3.0}
                                                     if loss == "distill" else {}))
        argv = launch_argv(tiny_model_dir, cfg, init)
        sep = argv.index("--")
        head, train = argv[:sep], argv[sep + 1:]
        assert head[:3] == ["ray", "job", "submit"] and head[head.index("--address") + 1] == "http://127.0.0.1:8265"
        env = json.loads(head[head.index("--runtime-env-json") + 1])["env_vars"]
        assert env[hooks.SPOOL_ENV] == os.path.realpath(tmp_path / "spool")
        assert str(ROOT) in env["PYTHONPATH"].split(":") and str(checkout) in env["PYTHONPATH"].split(":")
        assert train[:2] == ["python3", str(checkout / "train.py")]
        assert train[-len(model_args):] == model_args
        unknown = [a for a in train[2:-len(model_args)] if a.startswith("--") and a not in SLIME_FLAGS | MEGATRON_FLAGS]
        assert unknown == []
        assert json.loads(train[train.index("--train-env-vars") + 1]) == {hooks.SPOOL_ENV: env[hooks.SPOOL_ENV]}
        assert "--debug-train-only" in train and "--disable-rollout-global-dataset" in train
        for flag in ("--rollout-function-path", "--custom-rm-path", "--custom-advantage-function-path"):
            if flag in train:  # slime's load_function: module path, then the attribute after the last dot
                module, _, attr = train[train.index(flag) + 1].rpartition(".")
                assert callable(getattr(importlib.import_module(module), attr))
        args = job_args(argv)
        assert args.load == os.path.realpath(init or tiny_model_dir)
        assert args.global_batch_size == 4 and train[train.index("--rollout-batch-size") + 1] == "4"
        expected, summary = expected_job(tiny_model_dir, cfg, init), hooks.job_summary(args)
        assert {k: summary[k] for k in expected} == pytest.approx(expected)  # what the trainer will wait for
        assert args.use_opd == (loss == "distill")
        if loss == "dis":
            assert args.loss_type == "policy_loss" and args.use_rollout_logprobs
            assert (args.eps_clip, args.eps_clip_high) == pytest.approx((0.7, 4.0))
        elif loss == "distill":  # slime's OPD, the teacher in Megatron, the ratio clipped above at is_cap only
            assert args.loss_type == "policy_loss" and args.use_rollout_logprobs and args.opd_type == "megatron"
            assert args.opd_teacher_load == os.path.realpath(teacher) and args.opd_kl_coef == 1.0
            assert (args.eps_clip, args.eps_clip_high) == pytest.approx((1.0, 2.0))
        else:
            assert args.loss_type == "sft_loss" and "--disable-compute-advantages-and-returns" in train


def test_the_cli_prints_the_launch_command(tmp_path, tiny_model_dir, capsys):
    cfg = trainer_config(tmp_path)
    recipe_config = tmp_path / "grpo.yaml"
    recipe_config.write_text(json.dumps({"batch_size": 4, "trainer": {"backend": "slime", "micro_batch_size": 2,
                                                                      "lr": 2e-6, "options": cfg.options}}))
    main(["--model-dir", str(tiny_model_dir), "--trainer", str(recipe_config)])
    assert shlex.split(capsys.readouterr().out) == launch_argv(tiny_model_dir, cfg)


def test_bad_inputs_say_what_to_fix(tmp_path, tiny_model_dir, tiny_model):
    def refused(exc, match, fn, *a, **kw):
        with pytest.raises(exc, match=match):
            fn(*a, **kw)

    refused(FileNotFoundError, "git clone https://github.com/THUDM/slime", launch_argv, tiny_model_dir,
            trainer_config(tmp_path, slime_dir=str(tmp_path / "no-slime")))
    refused(ValueError, r"trainer.options.spool_dir is required", launch_argv, tiny_model_dir,
            trainer_config(tmp_path, spool_dir=""))
    refused(ValueError, "model_args_script", launch_argv, tiny_model_dir,
            trainer_config(tmp_path, model_args_script=""))
    refused(FileNotFoundError, "scripts/models", launch_argv, tiny_model_dir,
            trainer_config(tmp_path, model_args_script=str(tmp_path / "nope.sh")))
    refused(FileNotFoundError, "no .safetensors", launch_argv, tiny_model_dir, trainer_config(tmp_path), tmp_path)
    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    refused(ValueError, "ref_load", launch_argv, other, trainer_config(tmp_path))
    refused(ValueError, "no LoRA", TrainerConfig, backend="slime", lora_rank=4)
    refused(ValueError, "auto or cuda", TrainerConfig, backend="slime", device="cpu")
    refused(ValueError, "multiple of micro_batch_size", TrainerConfig, backend="slime", options={"batch_size": 12})
    refused(ValueError, "backend 'torch' takes no options", TrainerConfig, options={"batch_size": 8})
    refused(ValueError, "trainer.options.spool is not a SlimeConfig field", TrainerConfig, backend="slime",
            options={"spool": "x"})

    refused(FileNotFoundError, "--save-hf", release_from_checkpoint, tmp_path / "missing", tmp_path / "r",
            tiny_model_dir, {})
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(ValueError, "convert_torch_dist_to_hf", release_from_checkpoint, empty, tmp_path / "r", tiny_model_dir, {})
    state = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    wrong = dict(state, **{"model.norm.weight": torch.ones(3)})
    slime_hf_save(tiny_model_dir, wrong, tmp_path / "misshapen")
    refused(ValueError, "has shape", release_from_checkpoint, tmp_path / "misshapen", tmp_path / "r",
            tiny_model_dir, {})
    renamed = {("decoder." + k if k.startswith("model.layers.0.") else k): v for k, v in state.items()}
    slime_hf_save(tiny_model_dir, renamed, tmp_path / "renamed")
    refused(ValueError, "not a checkpoint of the base", release_from_checkpoint, tmp_path / "renamed",
            tmp_path / "r", tiny_model_dir, {})
    assert not (tmp_path / "r").exists()  # nothing is written for a refused checkpoint


def test_the_trainer_refuses_a_missing_or_foreign_job(slime_standin, tmp_path, tiny_model_dir):
    cfg = trainer_config(tmp_path, connect_timeout_s=0.5)
    with pytest.raises(TimeoutError, match="python -m reef_lab.trainers.slime --model-dir"):
        make_trainer(cfg, tiny_model_dir, None)  # `slime` picks SlimeTrainer, which finds no job on the spool
    release = tmp_path / "release"
    release.mkdir()
    (release / "model.safetensors").write_bytes((tiny_model_dir / "model.safetensors").read_bytes())
    args = job_args(launch_argv(tiny_model_dir, cfg, release))  # a job started from a release's weights
    hooks.write_json(hooks.job_path(slime_standin), {"job_id": "j", "state": "waiting", "seq": 1,
                                                     "time": time.time(), **hooks.job_summary(args)})
    with pytest.raises(ValueError, match="launched for another trainer: load is"):
        SlimeTrainer(tiny_model_dir, cfg)  # this scenario serves the base
    trainer = SlimeTrainer(tiny_model_dir, cfg, release)
    refused = {"batch_size": reef_samples(1, 3), "rollout_temperature": reef_samples(temperature=0.7)}
    for match, batch in refused.items():
        with pytest.raises(ValueError, match=match):
            trainer.step(batch, Loss("dis"))
    with pytest.raises(ValueError, match="dis_low"):
        trainer.step(reef_samples(), Loss("dis", 0.2, 5.0))
    with pytest.raises(NotImplementedError, match="backend torch"):
        trainer.logprobs(reef_samples())
    with pytest.raises(NotImplementedError, match="sao on trainer.backend torch"):
        trainer.critic(None)
    assert hooks.last_step(slime_standin) == 0  # nothing was spooled


def test_slime_is_chosen_by_its_short_name_without_importing_slime():
    code = ("import sys; from reef_lab.trainers import trainer_class; import reef_lab.trainers.slime_hooks; "
            "print(trainer_class('slime').__name__, "
            "[m for m in ('slime', 'ray', 'megatron', 'sglang', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["SlimeTrainer", "[]"]
    assert trainer_class("slime") is SlimeTrainer
