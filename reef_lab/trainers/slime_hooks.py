"""reef_lab's hooks inside a slime job, and the spool format they share with reef_lab's Slime backend.

slime (https://github.com/THUDM/slime, read at commit 624b824a) trains a Megatron policy in a Ray job whose loop is
`generate_rollout -> train -> save`. reef_lab does not let slime generate: its rollouts are the records serving
already made (prompt and completion token ids, the engine's logprob of each token, a report's score). The Slime
backend (reef_lab/trainers/slime.py) spools each batch a recipe trains on as a JSON file, and the slime job reads it
through these functions, named by dotted path on slime's command line (slime.utils.misc.load_function):

- `generate_rollout` (`--rollout-function-path`): slime's rollout hook, `(args, rollout_id, data_source,
  evaluation=False)`. It acknowledges the batch slime trained on last time (slime calls it again only after that
  step's train and save), waits for the next spooled batch and returns it as slime `Sample`s grouped per prompt
  (`RolloutFnTrainOutput(samples=list[list[Sample]])`): `tokens` = prompt + completion ids, `response_length`,
  `loss_mask` (the sample's: 1 on generated tokens, 0 on an episode's tool results), `rollout_log_probs`, `reward` (the report's score), `status`, and a globally
  unique `index` that encodes the spool step and position.
- `reward` (`--custom-rm-path`): slime's reward hook, `async (args, sample | list[Sample])`: the report's score
  the sample carries (slime's own rollout function is not used, so this answers any slime path that re-scores).
- `advantages` (`--custom-advantage-function-path`): `(args, rollout_data)`, run on the training ranks: sets
  `rollout_data["advantages"]` to the recipe's own per-token advantages, found by each sample's index (slime passes
  `sample_indices` to the train side; it does not pass per-sample metadata).

Spool layout (`REEF_SLIME_SPOOL`, a folder both reef_lab and every slime rank can read): `steps/<seq>.json` (a batch,
written by reef_lab), `acks/<seq>.json` (written here once slime trained on it, with the HF checkpoint slime saved
for that rollout, or the error that stopped the job), `job.json` (this job: what it was launched with, and whether it
is waiting for a batch or training one). All writes are atomic (write, fsync, rename).

This module runs in slime's processes: it imports only the standard library at module level; torch and slime's
types are imported inside the functions that slime calls.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path

SPOOL_ENV = "REEF_SLIME_SPOOL"
FORMAT = 1
INDEX_STRIDE = 1_000_000  # a sample's slime index: spool step * INDEX_STRIDE + position in the batch
POLL_S = 0.2
HEARTBEAT_S = 5.0  # a waiting job rewrites job.json this often, so reef_lab can tell a live job from a dead one
SLIME_LOSS = {"dis": "policy_loss", "nll": "sft_loss", "distill": "policy_loss"}  # Loss.kind -> --loss-type


# ---- the spool (both sides) ---------------------------------------------------------------------------------------
def step_path(spool: str | Path, seq: int) -> Path:
    return Path(spool) / "steps" / f"{seq:08d}.json"


def ack_path(spool: str | Path, seq: int) -> Path:
    return Path(spool) / "acks" / f"{seq:08d}.json"


def job_path(spool: str | Path) -> Path:
    return Path(spool) / "job.json"


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def last_step(spool: str | Path) -> int:
    """The highest step number spooled so far (0: none)."""
    folder = Path(spool) / "steps"
    seqs = [int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit()] if folder.is_dir() else []
    return max(seqs, default=0)


def job_summary(args) -> dict:
    """What reef_lab must agree with before it spools a batch to this job (reef_lab.trainers.slime.expected_job
    builds the same keys from its config)."""
    def real(p):
        return os.path.realpath(p) if p else None
    return {"hf_checkpoint": real(args.hf_checkpoint), "load": real(args.load), "loss_type": args.loss_type,
            "eps_clip": args.eps_clip, "eps_clip_high": args.eps_clip_high,
            "use_rollout_logprobs": bool(args.use_rollout_logprobs),
            "custom_advantage_function_path": args.custom_advantage_function_path,
            "rollout_temperature": args.rollout_temperature, "global_batch_size": args.global_batch_size,
            "save_hf": args.save_hf, "save_interval": args.save_interval,
            "context_parallel_size": getattr(args, "context_parallel_size", 1),
            "use_opd": bool(getattr(args, "use_opd", False)), "opd_type": getattr(args, "opd_type", None),
            "opd_teacher_load": real(getattr(args, "opd_teacher_load", None)),
            "opd_kl_coef": getattr(args, "opd_kl_coef", None)}


# ---- batch -> slime samples ---------------------------------------------------------------------------------------
def check_batch(args, batch: dict) -> None:
    """Refuse a batch this job would train on wrongly; the message names the fix."""
    if batch.get("format") != FORMAT:
        raise ValueError(f"spool batch format {batch.get('format')!r}, this hook reads {FORMAT}: run the same "
                         "reef_lab version on both sides")
    samples, kind = batch["samples"], batch["loss"]["kind"]
    if SLIME_LOSS[kind] != args.loss_type:
        raise ValueError(f"the recipe's loss is {kind!r} (slime --loss-type {SLIME_LOSS[kind]}), but this job runs "
                         f"--loss-type {args.loss_type}: relaunch with trainer.options.loss: {kind}")
    if len(samples) != args.global_batch_size:
        raise ValueError(f"the batch holds {len(samples)} samples, but this job steps on --global-batch-size "
                         f"{args.global_batch_size} (slime would drop the rest): set trainer.options.batch_size to the "
                         "recipe's batch size and relaunch")
    for s in samples:
        if abs(s["temperature"] - args.rollout_temperature) > 1e-6:
            raise ValueError(f"record {s['record_id']} was sampled at temperature {s['temperature']}, but slime "
                             f"scores tokens at --rollout-temperature {args.rollout_temperature}: serve this "
                             "scenario at one temperature and set trainer.options.rollout_temperature to it")
        n = len(s["completion_ids"])
        if kind in ("dis", "distill") and (s.get("logprobs") is None or len(s["logprobs"]) != n
                                           or s.get("advantages") is None or len(s["advantages"]) != n):
            raise ValueError(f"record {s['record_id']}: the {kind} loss needs a rollout logprob and an advantage per "
                             f"completion token ({n})")


def samples_from_batch(batch: dict, seq: int, sample_cls) -> list[list]:
    """The batch as slime Samples, grouped the way slime's data source groups them (one list per prompt: the
    recipe's `group`, or the record alone)."""
    groups: dict[str, list] = {}
    for pos, s in enumerate(batch["samples"]):
        key = s["group"] if s.get("group") is not None else "record:" + s["record_id"]
        group = groups.setdefault(key, [])
        completion = list(s["completion_ids"])
        group.append(sample_cls(
            group_index=None, index=seq * INDEX_STRIDE + pos, tokens=list(s["prompt_ids"]) + completion,
            response_length=len(completion), reward=float(s["score"]) if s.get("score") is not None else 0.0,
            loss_mask=[int(m) for m in s.get("loss_mask") or [1] * len(completion)],
            rollout_log_probs=[float(x) for x in s["logprobs"]] if batch["loss"]["kind"] in ("dis", "distill") else None,
            status=sample_cls.Status.COMPLETED,
            metadata={"reef_lab": {"record_id": s["record_id"], "report_id": s.get("report_id"),
                                   "release_id": s.get("release_id"), "score": s.get("score"), "step": seq,
                                   "position": pos}}))
    out = list(groups.values())
    for i, group in enumerate(out):
        for sample in group:
            sample.group_index = i
    return out


# ---- slime's rollout hook (runs in slime's RolloutManager) --------------------------------------------------------
_JOB: dict = {}  # this process's job: id, spool, the step slime is training on


def spool_dir() -> Path:
    spool = os.environ.get(SPOOL_ENV)
    if not spool:
        raise RuntimeError(f"{SPOOL_ENV} is not set in the slime job's environment: launch the job with the command "
                           "`python -m reef_lab.trainers.slime` prints (it sets it in --runtime-env-json and "
                           "--train-env-vars)")
    return Path(spool)


def _announce(args, state: str, seq: int, rollout_id: int) -> None:
    write_json(job_path(_JOB["spool"]), {
        "format": FORMAT, "job_id": _JOB["id"], "host": socket.gethostname(), "pid": os.getpid(),
        "started": _JOB["started"], "state": state, "seq": seq, "rollout_id": rollout_id, "time": time.time(),
        **job_summary(args)})


def _hf_checkpoint(args, rollout_id: int) -> str | None:
    """The HF folder slime saved for `rollout_id` (--save-hf), when it saved one."""
    if not args.save_hf:
        return None
    folder = Path(args.save_hf.format(rollout_id=rollout_id))
    return os.path.realpath(folder) if any(folder.glob("*.safetensors")) else None


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    """slime's rollout function: the next batch reef_lab spooled, as slime Samples (see the module docstring)."""
    if evaluation:
        raise NotImplementedError("reef_lab judges candidates on its own held-out task: launch slime without "
                                  "--eval-interval")
    from slime.rollout.base_types import RolloutFnTrainOutput
    from slime.utils.types import Sample

    if not _JOB:
        spool = spool_dir()
        _JOB.update(id=uuid.uuid4().hex, spool=spool, started=time.time(), pending=None)
    spool, pending = _JOB["spool"], _JOB["pending"]
    seq = last_step(spool) + 1 if pending is None else pending["seq"] + 1
    _announce(args, "waiting", seq, rollout_id)  # before the ack: reef_lab's next step finds the job waiting
    if pending is not None:  # slime calls again only after it trained (and saved) the pending step
        write_json(ack_path(spool, pending["seq"]), {
            "seq": pending["seq"], "job_id": _JOB["id"], "rollout_id": pending["rollout_id"], "trained": True,
            "train_s": round(time.time() - pending["taken"], 3),
            "hf_checkpoint": _hf_checkpoint(args, pending["rollout_id"])})
        _JOB["pending"] = None
    path, beat = step_path(spool, seq), time.monotonic()
    while not path.is_file():
        if time.monotonic() - beat >= HEARTBEAT_S:
            _announce(args, "waiting", seq, rollout_id)
            beat = time.monotonic()
        time.sleep(POLL_S)
    batch = read_json(path)
    try:
        if batch.get("job_id") != _JOB["id"]:
            raise ValueError(f"spool step {seq} was written for slime job {batch.get('job_id')}, not this one "
                             f"({_JOB['id']}): one reef_lab trainer and one slime job per spool")
        check_batch(args, batch)
        groups = samples_from_batch(batch, seq, Sample)
    except Exception as e:
        write_json(ack_path(spool, seq), {"seq": seq, "job_id": _JOB["id"], "rollout_id": rollout_id,
                                          "trained": False, "error": f"{type(e).__name__}: {e}"})
        raise
    _JOB["pending"] = {"seq": seq, "rollout_id": rollout_id, "taken": time.time()}
    _announce(args, "training", seq, rollout_id)
    n = len(batch["samples"])
    return RolloutFnTrainOutput(samples=groups, metrics={
        "reef_lab/step": seq, "reef_lab/trainer_step": batch.get("trainer_step"),
        "reef_lab/score_mean": sum(s["score"] or 0.0 for s in batch["samples"]) / n})


# ---- slime's reward hook ------------------------------------------------------------------------------------------
def _score(sample) -> float:
    meta = sample.metadata.get("reef_lab") if isinstance(sample.metadata, dict) else None
    if meta is None:
        raise ValueError("this sample did not come from reef_lab's spool (no metadata['reef_lab']): the reward hook "
                         "only answers samples reef_lab's rollout hook made")
    score = meta.get("score")
    return float(score) if score is not None else 0.0  # an unscored demonstration, as slime's sft rollout: 0


async def reward(args, sample, **kwargs):
    """slime's --custom-rm-path: the report's score (a list of them for --group-rm)."""
    if isinstance(sample, list):
        return [_score(s) for s in sample]
    return _score(sample)


# ---- slime's advantage hook (runs on the training ranks) ----------------------------------------------------------
_ADVANTAGES: dict[int, list] = {}


def _batch_advantages(seq: int) -> list:
    if seq not in _ADVANTAGES:
        batch = read_json(step_path(spool_dir(), seq))
        _ADVANTAGES.clear()  # a rank trains one step at a time
        _ADVANTAGES[seq] = [s.get("advantages") for s in batch["samples"]]
    return _ADVANTAGES[seq]


def advantages(args, rollout_data) -> None:
    """slime's --custom-advantage-function-path: the recipe's per-token advantages, per sample of this rank."""
    import torch

    kl = rollout_data["kl"]
    out = []
    for i, index in enumerate(rollout_data["sample_indices"]):
        seq, pos = divmod(int(index), INDEX_STRIDE)
        adv = _batch_advantages(seq)[pos]
        if adv is None or len(adv) != kl[i].numel():
            raise ValueError(f"spool step {seq} sample {pos}: {0 if adv is None else len(adv)} advantages for "
                             f"{kl[i].numel()} tokens on this rank (reef_lab's advantages need "
                             "--context-parallel-size 1)")
        out.append(torch.tensor(adv, dtype=torch.float32, device=kl[i].device))
    rollout_data["advantages"] = out
    rollout_data["returns"] = out
