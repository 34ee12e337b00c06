"""An agent episode as one training sample: the token ids of every turn in order, loss only on what the model wrote.

A report that references several calls of one episode (or names the episode itself: POST /reef/report
{"episode": id, ...}) builds one Sample. Its prompt is the first turn's prompt; its completion is everything after:
turn 1's generated tokens, then what turn 2's prompt added (tool results, a user turn, the chat template's own
tokens), turn 2's generated tokens, and so on. `loss_mask` is 1 exactly on generated tokens.

That concatenation is only right when each turn's prompt extends the previous turn's prompt plus its generated
tokens token for token. Re-tokenising the rendered history can differ from what was generated (a tool call rendered
with other whitespace, a prefill, a client that rewrote or trimmed its history): such an episode is split into one
sample per call and counted (`split_drift`), never trained misaligned. All turns of a sample must come from one
release (its logprobs and staleness are per release): an episode that spans releases is split or dropped by
`EpisodeConfig.mixed_release`, and a split episode's per-call samples then meet the recipe's own staleness policy.
Turns sampled at different temperatures are split too (`split_temperature`): a sample has one temperature.

Only `ok` records with token ids train: refused, cancelled and failed calls, and relayed ones (no token ids), are
left out and counted (`excluded`).

`samples: per_call` makes one sample per call instead, each with the state after it (what the next turn's prompt
added: the tool results it caused) in `extra["next_state_ids"]`, so a recipe can judge each call by what followed,
as OpenClaw-RL does; the score is the report's until a recipe sets its own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from reef_lab.trainers.samples import Sample, sample_from_records
from reef_lab.schema import check_fields

SAMPLES = ("episode", "per_call")
MIXED_RELEASE = ("split", "drop")


@dataclass
class EpisodeConfig:
    """How a report on an episode becomes samples (a LearnConfig's `episodes` mapping)."""

    samples: str = field(default="episode", metadata={
        "help": "episode: one sample of all turns (loss on generated tokens only); per_call: one sample per call, "
                "with the state after it in extra['next_state_ids']"})
    mixed_release: str = field(default="split", metadata={
        "help": "an episode whose turns were served by different releases: split (one sample per call, each then "
                "judged by the recipe's staleness policy) or drop (no sample)"})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.samples not in SAMPLES:
            raise ValueError(f"episodes.samples must be one of {SAMPLES}, got {self.samples!r}")
        if self.mixed_release not in MIXED_RELEASE:
            raise ValueError(f"episodes.mixed_release must be one of {MIXED_RELEASE}, got {self.mixed_release!r}")


def trainable(rec: dict) -> bool:
    return rec.get("status") == "ok" and bool(rec.get("token_ids")) and bool(rec.get("prompt_token_ids"))


def turn_order(records: list[dict]) -> list[dict]:
    """An episode's records in turn order: (created_at, id), as reef_lab/gateway/episodes.py numbers them."""
    return sorted(records, key=lambda r: (r.get("created_at") or 0.0, r["id"]))


def samples_for_report(report: dict, inferences: list[dict], config: EpisodeConfig,
                       counts: Counter | None = None) -> list[Sample]:
    """The samples a report makes of the inference records it references; `counts` (if given) gains what
    happened: episodes, episode_samples, per_call_samples, split_drift, split_release, split_temperature,
    dropped_release, excluded."""
    counts = counts if counts is not None else Counter()
    groups: dict[str, list[dict]] = {}
    out: list[Sample] = []
    for rec in inferences:
        if not trainable(rec):
            counts["excluded"] += 1
            continue
        if rec.get("episode"):
            groups.setdefault(rec["episode"], []).append(rec)
        else:
            out.append(sample_from_records(rec, report))
    for episode, records in groups.items():
        if len(records) == 1:
            out.append(sample_from_records(records[0], report))
            continue
        counts["episodes"] += 1
        out += episode_samples(episode, turn_order(records), report, config, counts)
    return out


def episode_samples(episode: str, turns: list[dict], report: dict, config: EpisodeConfig,
                    counts: Counter) -> list[Sample]:
    """Samples of one episode's trainable turns (in turn order)."""
    if len({t.get("release_id") or "base" for t in turns}) > 1:
        if config.mixed_release == "drop":
            counts["dropped_release"] += 1
            return []
        counts["split_release"] += 1
        return per_call(episode, turns, report, counts)
    singles = [sample_from_records(t, report) for t in turns]
    if len({s.temperature for s in singles}) > 1:
        counts["split_temperature"] += 1
        return per_call(episode, turns, report, counts)
    added = extensions(turns)
    if added is None:
        counts["split_drift"] += 1
        return per_call(episode, turns, report, counts)
    if config.samples == "per_call":
        return per_call(episode, turns, report, counts, added)
    completion, mask, logprobs = [], [], []
    for k, turn in enumerate(turns):
        if k:
            completion += added[k - 1]
            mask += [0] * len(added[k - 1])
            logprobs += [0.0] * len(added[k - 1])  # never read: the mask is 0 there
        completion += turn["token_ids"]
        mask += [1] * len(turn["token_ids"])
        logprobs += list(turn.get("logprobs") or [])
    first = singles[0]
    counts["episode_samples"] += 1
    return [Sample(record_id=first.record_id, prompt_ids=first.prompt_ids, completion_ids=completion,
                   logprobs=logprobs if all(s.logprobs is not None for s in singles) else None,
                   score=report.get("score"), release_id=first.release_id, temperature=first.temperature,
                   group=first.group, created_at=singles[-1].created_at, report_id=report.get("id"),
                   loss_mask=mask, extra={"episode": episode, "records": [t["id"] for t in turns],
                                          "turns": len(turns)})]


def extensions(turns: list[dict]) -> list[list[int]] | None:
    """What each later turn's prompt adds after everything before it (prompt and generated tokens so far), or None
    when some turn's prompt does not start with that history token for token."""
    history = list(turns[0]["prompt_token_ids"]) + list(turns[0]["token_ids"])
    added = []
    for turn in turns[1:]:
        prompt = list(turn["prompt_token_ids"])
        if prompt[:len(history)] != history:
            return None
        added.append(prompt[len(history):])
        history = prompt + list(turn["token_ids"])
    return added


def per_call(episode: str, turns: list[dict], report: dict, counts: Counter,
             added: list[list[int]] | None = None) -> list[Sample]:
    """One sample per call; with `added` (the turns extend each other) each carries the state after it."""
    out = []
    for k, turn in enumerate(turns):
        s = sample_from_records(turn, report)
        s.extra.update({"episode": episode, "call": k + 1})  # k-th trainable call of the episode
        if added is not None and k < len(added):
            s.extra["next_state_ids"] = added[k]
        out.append(s)
    counts["per_call_samples"] += len(out)
    return out
