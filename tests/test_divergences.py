"""The divergences' one table (reef_lab/trainers/divergences.py): every reader takes its answer from it, and a
plug-in adds a divergence with a row and a function, no edit elsewhere (issue 53)."""

from __future__ import annotations

import pytest

from reef_lab.learning.distill import DistillConfig
from reef_lab.trainers import losses
from reef_lab.trainers.base import Loss
from reef_lab.trainers.divergences import TABLE, Divergence, divergence, register

CALLS: list = []


def half_forward_kl(logp, batch, chunk, *, is_cap, jsd_beta):
    """A plug-in's divergence: records its call, returns half of forward_kl's."""
    CALLS.append((is_cap, jsd_beta))
    return "loss", {"half_forward_kl_sum": 0.5}


def test_the_table_answers_every_reader():
    assert list(TABLE) == ["reverse_kl", "forward_kl", "jsd"]
    assert [d.name for d in TABLE.values() if d.top_k] == ["forward_kl", "jsd"]
    assert DistillConfig(divergence="jsd", top_k=4).scored_top_k == 4
    assert DistillConfig(divergence="reverse_kl", top_k=4).scored_top_k == 0
    with pytest.raises(ValueError, match="divergence must be one of reverse_kl, forward_kl, jsd, got 'nope'"):
        Loss("distill", divergence="nope")
    with pytest.raises(ValueError, match="divergence must be one of"):
        DistillConfig(divergence="nope")
    assert "reverse_kl: on-policy distillation" in DistillConfig.__dataclass_fields__["divergence"].metadata["help"]


def test_a_plugin_divergence_is_a_row_and_a_function():
    row = register(Divergence("half_forward_kl", top_k=True, loss=f"{__name__}:half_forward_kl"))
    try:
        assert register(row) is row  # the same row again (a module imported twice) is fine
        with pytest.raises(ValueError, match="registered already"):
            register(Divergence("half_forward_kl", top_k=False, loss=f"{__name__}:half_forward_kl"))
        assert divergence("half_forward_kl").top_k
        cfg = DistillConfig(divergence="half_forward_kl", top_k=8, is_cap=3.0, jsd_beta=0.25)
        assert cfg.scored_top_k == 8 and cfg.loss == Loss("distill", divergence="half_forward_kl", is_cap=3.0,
                                                          jsd_beta=0.25)
        fn = losses.distill_token_loss("half_forward_kl", 3.0, 0.25)
        assert fn(None, {}, []) == ("loss", {"half_forward_kl_sum": 0.5}) and CALLS[-1] == (3.0, 0.25)
    finally:
        TABLE.pop("half_forward_kl", None)


def test_slime_runs_only_the_rows_that_say_so():
    assert [d.name for d in TABLE.values() if d.slime] == ["reverse_kl"]
