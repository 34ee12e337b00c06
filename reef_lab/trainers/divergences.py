"""The divergences a distillation step can minimise, one table that every part reads: the recipes' configs (which
names exist, whether a top-K is scored), the torch trainer (whether it computes the student's top-K logprobs),
the loss (which function), slime's mapping (which it can run). Imported without torch.

A new divergence is a row and a function: `register(Divergence("my_kl", top_k=True, loss="my_pkg.losses:my_kl"))`
in the plug-in's module (a recipe the operator names imports it), the function taking
`(logp, batch, chunk, *, is_cap, jsd_beta)` and returning `(loss summed over trained tokens, stats)`, its stats
carrying `<name>_sum` (the divergence summed, shown per token in the step's metrics). Rows are never named by a
client as code: a client's config picks a registered name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Divergence:
    name: str
    top_k: bool  # over the teacher's top-K tokens at each position (else: the teacher's logprob of the sampled one)
    loss: str  # module:function of its token loss (imported when a step runs: it needs torch)
    slime: bool = False  # slime's on-policy distillation runs it (reef_lab/trainers/slime.py)
    help: str = ""


TABLE: dict[str, Divergence] = {}


def register(row: Divergence) -> Divergence:
    """Add a divergence to the table (ValueError for a name it holds already)."""
    if row.name in TABLE and TABLE[row.name] != row:
        raise ValueError(f"divergence {row.name!r} is registered already")
    TABLE[row.name] = row
    return row


def divergence(name: str) -> Divergence:
    """The row of `name`; ValueError naming the ones there are."""
    row = TABLE.get(name)
    if row is None:
        raise ValueError(f"divergence must be one of {', '.join(TABLE)}, got {name!r}")
    return row


register(Divergence("reverse_kl", top_k=False, loss="reef_lab.trainers.losses:reverse_kl_loss", slime=True,
                    help="on-policy distillation on the sampled token (mode-seeking); the importance ratio to the "
                         "rollout's policy truncated at is_cap"))
register(Divergence("forward_kl", top_k=True, loss="reef_lab.trainers.losses:forward_kl_loss",
                    help="KL(teacher || student) over the teacher's top_k tokens (mass-covering)"))
register(Divergence("jsd", top_k=True, loss="reef_lab.trainers.losses:jsd_loss",
                    help="the generalised Jensen-Shannon divergence over the teacher's top_k tokens, jsd_beta its "
                         "weight on the teacher"))
