"""Losses a recipe brings (reef_lab.trainers.base.SequenceLoss) and the `dpo` recipe built on one.

The gradient test: one step of the torch trainer on DPO pairs (one of them an episode with a tool result masked out,
pairs of different lengths, a micro-batch size that would split a pair) leaves in every trainable parameter the
gradient of DPO written directly in torch, -logsigmoid(beta * ((pc - rc) - (pr - rr))) averaged over pairs, with
each sequence scored on its own and the reference a separately loaded base model. The live smoke test is in
test_learning.py with the other recipes'.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from reef_lab.errors import BadRequest
from reef_lab.learning.recipe import load_recipe
from reef_lab.trainers.samples import Sample
from reef_lab.trainers.base import LOSSES, Loss, SequenceLoss, TrainerConfig, require_sequence_losses
from recipes.dpo.loss import PAIR, ROLE
from recipes.dpo.recipe import DPORecipe, preference_pairs


def s(rid, prompt, completion, score, **kw):
    return Sample(rid, list(prompt), list(completion), None, score, "base", **kw)


# ---- the core: built-in kinds are checked, a recipe's own loss is refused where it cannot run ---------------------
def test_an_unknown_loss_kind_is_refused_never_run_as_dis():
    from reef_lab.trainers.torch_trainer import _torch_losses, loss_function

    with pytest.raises(ValueError, match="loss kind must be one of"):
        Loss("dpo")
    assert set(_torch_losses()) == set(LOSSES)  # the torch trainer runs every built-in kind by name
    smuggled = object.__new__(Loss)  # a Loss that skipped its own check (e.g. a kind added to LOSSES later)
    object.__setattr__(smuggled, "kind", "kto")
    with pytest.raises(ValueError, match="no loss 'kto'"):
        loss_function(smuggled)


def test_a_backend_without_sequence_losses_is_refused_when_configured(tmp_path):
    require_sequence_losses({}, "dpo")  # torch: fine
    with pytest.raises(ValueError, match="backend 'slime'.*cannot run"):
        require_sequence_losses(TrainerConfig(backend="slime"), "dpo")
    # at scenario creation (a client or the operator configuring it) ...
    with pytest.raises(BadRequest, match="backend 'slime'"):
        load_recipe("dpo", {"trainer": {"backend": "slime"}})
    # ... and when an experiment is configured, before any model loads
    from reef_lab.experiments.weights import ExperimentConfig

    with pytest.raises(ValueError, match="backend 'slime'"):
        ExperimentConfig(recipe="dpo", recipe_config={"trainer": {"backend": "slime"}}, rollouts=8)
    assert ExperimentConfig(recipe="dpo", rollouts=8).group_size == 4


def test_slime_refuses_a_sequence_loss_step(tmp_path):
    from reef_lab.trainers.slime import SlimeTrainer

    trainer = object.__new__(SlimeTrainer)  # _check needs only the config
    trainer.slime = None
    with pytest.raises(TypeError, match="backend torch"):
        trainer._check([], DPORecipe().loss)


def test_a_sequence_loss_gets_whole_groups_and_its_own_denominator(tiny_model_dir):
    """A custom loss sees micro-batches of whole groups (micro_batch_size 3 with groups of 2: chunks of 2), masks,
    logprobs at temperature 1, and the step divides by its units."""
    from reef_lab.trainers.torch_trainer import TorchTrainer

    seen = []

    class MeanLogp(SequenceLoss):
        name, group = "mean-logp", 2

        def __call__(self, logp, mask, samples, ref_logp):
            seen.append(([x.record_id for x in samples], mask.tolist(), ref_logp))
            return -(logp * mask).sum(), {"calls": 1.0}

    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu", micro_batch_size=3, lr=1e-3))
    batch = [s(f"r{i}", [5, 9 + i], [20, 31, 7], 0.0, temperature=0.5, loss_mask=[1, 0, 1] if i == 0 else None)
             for i in range(4)]
    expected = -sum(sum(lp) for lp in trainer.logprobs([Sample(**{**x.__dict__, "temperature": 1.0}) for x in batch]))
    m = trainer.step(batch, MeanLogp())
    assert [ids for ids, _, _ in seen] == [["r0", "r1"], ["r2", "r3"]]
    assert seen[0][1][0] == [1.0, 0.0, 1.0] and seen[0][2] is None
    assert m["units"] == 2 and m["calls"] == 2 and m["tokens"] == 11
    assert m["loss"] == pytest.approx(expected / 2, rel=1e-5)
    with pytest.raises(ValueError, match="groups of 2"):
        trainer.step(batch[:3], MeanLogp())


# ---- the dpo recipe: pairs ------------------------------------------------------------------------------------------
def test_pairs_are_answers_to_one_prompt_with_different_scores():
    a = [s("a1", [1, 2], [7], 0.0), s("a2", [1, 2], [8], 1.0), s("a3", [1, 2], [9], 0.5), s("a4", [1, 2], [6], 1.0)]
    b = [s("b1", [1, 3], [7], 1.0), s("b2", [1, 3], [8], 1.0)]  # equal scores: no pair
    c = [s("c1", [4], [7], 0.2)]  # alone
    d = [s("d1", [5], [7], 0.0), s("d2", [5], [7, 7], 0.3)]
    pool = [d[0]] + a + b + c + [d[1]]
    pairs = preference_pairs(pool, 0.0)
    assert [(x.record_id, y.record_id) for x, y in pairs] == [("d2", "d1"), ("a2", "a1"), ("a4", "a3")]
    assert [(x.record_id, y.record_id) for x, y in preference_pairs(pool, 0.4)] == [("a2", "a1"), ("a4", "a3")]
    assert preference_pairs(pool, 1.0) == []


def test_build_batch_orders_pairs_and_drops_the_oldest_unpaired():
    recipe = DPORecipe(batch_pairs=2, max_waiting=2)
    pool = [s("x1", [9], [1], 1.0), s("x2", [8], [1], 1.0), s("x3", [7], [1], 0.0),
            s("a1", [1], [7], 0.0), s("a2", [1], [8], 1.0), s("b1", [2], [7], 1.0), s("b2", [2], [8], 0.0)]
    assert recipe.ready(pool, 0, {})
    batch, dropped = recipe.build_batch(pool, 0, {})
    assert [(x.record_id, x.extra[ROLE]) for x in batch] == [("a2", "chosen"), ("a1", "rejected"),
                                                             ("b1", "chosen"), ("b2", "rejected")]
    assert batch[0].extra[PAIR] == batch[1].extra[PAIR] != batch[2].extra[PAIR]
    assert [x.record_id for x in dropped] == ["x1"]  # three wait, two may
    assert not pool[3].extra  # the pool's own samples are not written to
    lonely = [s(f"u{i}", [i], [1], 1.0) for i in range(4)]
    assert recipe.ready(lonely, 0, {})  # too many waiting: a round that only drops
    assert recipe.build_batch(lonely, 0, {}) == ([], lonely[:2])


def test_dpo_config_is_checked():
    for bad, match in [({"beta": 0}, "beta"), ({"beta": float("inf")}, "beta"), ({"group_size": 1}, "group_size"),
                       ({"min_score_gap": -1}, "min_score_gap"), ({"batch_pairs": 0}, "batch_pairs")]:
        with pytest.raises(BadRequest, match=match):
            load_recipe("dpo", bad)


# ---- the gradient against DPO written directly ----------------------------------------------------------------------
def _pairs() -> list[Sample]:
    """Two pairs; the first chosen answer is a two-turn episode whose tool result (3 tokens) is masked out."""
    raw = [("c0", [5, 9, 14], [20, 31, 88, 61, 90, 7, 2], 1.0, [1, 1, 0, 0, 0, 1, 1]),
           ("r0", [5, 9, 14], [42, 8], 0.0, None),
           ("c1", [7, 3], [11, 12, 13], 1.0, None),
           ("r1", [7, 3], [19, 17, 23, 29, 2], 0.5, None)]
    out = []
    for k, (rid, prompt, completion, score, mask) in enumerate(raw):
        x = s(rid, prompt, completion, score, loss_mask=mask, temperature=0.7)
        x.extra.update({ROLE: "chosen" if k % 2 == 0 else "rejected", PAIR: f"p{k // 2}"})
        out.append(x)
    return out


def _sequence_logp(model, x: Sample) -> torch.Tensor:
    """log pi(completion | prompt) summed over the masked-in tokens: one sequence, no padding, temperature 1."""
    ids = torch.tensor([x.prompt_ids + x.completion_ids])
    logits = model(input_ids=ids).logits[0, :-1].float()
    token_logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    completion = token_logp[len(x.prompt_ids) - 1:]
    return (completion * torch.tensor(x.mask, dtype=torch.float32)).sum()


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_dpo_gradient_matches_dpo_written_directly(tiny_model_dir, lora_rank):
    from transformers import AutoModelForCausalLM

    from reef_lab.trainers.torch_trainer import TorchTrainer

    beta = 0.5
    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu", micro_batch_size=3, lr=1e-3,
                                                         max_grad_norm=0, lora_rank=lora_rank))
    torch.manual_seed(1)
    with torch.no_grad():  # move the policy off the base, so policy and reference terms differ
        for name, p in trainer.model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * (0.05 if lora_rank else 0.01))
    policy = copy.deepcopy(trainer.model)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    pairs = _pairs()

    losses = []
    for c, r in zip(pairs[0::2], pairs[1::2]):
        with torch.no_grad():
            rc, rr = _sequence_logp(reference, c), _sequence_logp(reference, r)
        pc, pr = _sequence_logp(policy, c), _sequence_logp(policy, r)
        losses.append(-F.logsigmoid(beta * ((pc - rc) - (pr - rr))))
    direct = torch.stack(losses).mean()
    direct.backward()

    got = {}  # the step's gradients, as the optimizer is about to use them (the step frees them afterwards)
    trainer.optimizer.register_step_pre_hook(lambda *_: got.update(
        {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}))
    m = trainer.step(pairs, DPORecipe(beta=beta).loss)
    assert m["loss"] == pytest.approx(direct.item(), rel=1e-5)
    assert m["units"] == 2 and m["tokens"] == 4 + 2 + 3 + 5
    assert abs(m["margin_sum"]) > 1e-3  # policy and reference differ: not the trivial log 2 of a fresh start
    want = {n: p.grad for n, p in policy.named_parameters() if p.requires_grad}
    assert set(want) == set(got) and want
    for n in want:  # float32 over padded micro-batches vs one sequence at a time: equal to ~1e-5 relative
        assert float((got[n] - want[n]).norm()) <= 1e-4 * float(want[n].norm()) + 1e-8, n
    assert any(float(g.abs().max()) > 1e-4 for g in got.values())


def test_the_shipped_examples_configure():
    import yaml

    from reef_lab.experiments.weights import ExperimentConfig

    examples = Path(__file__).resolve().parents[1] / "recipes/dpo/examples"
    exp = ExperimentConfig(**yaml.safe_load((examples / "arithmetic.yaml").read_text()))
    assert exp.group_size == 4 and exp.rollouts % exp.group_size == 0
    recipe = load_recipe("dpo", yaml.safe_load((examples / "live.yaml").read_text()))
    assert recipe.config.batch_pairs == 8 and recipe.loss.beta == 0.1


def test_the_documented_sequence_loss_runs_as_written(tmp_path, tiny_model_dir, monkeypatch):
    """docs/extending.md's toy recipe with its own loss: refused on slime when configured, a step on torch."""
    import importlib
    import re

    from reef_lab.trainers.torch_trainer import TorchTrainer

    doc = (Path(__file__).resolve().parents[1] / "docs/extending.md").read_text()
    (code,) = re.findall(r"```python\n# best_recipe.py\n(.*?)```", doc, flags=re.S)
    (tmp_path / "best_recipe.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("best_recipe")
    with pytest.raises(ValueError, match="backend 'slime'"):
        mod.BestRecipe(trainer={"backend": "slime"})
    recipe = mod.BestRecipe(batch_size=3)
    pool = [s(f"r{i}", [5, 9], [20 + i, 31], float(i % 2)) for i in range(3)]
    batch, dropped = recipe.build_batch(pool, 0, {})
    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu", lr=1e-3))
    best = -sum(lp for x, lps in zip(batch, trainer.logprobs(batch)) if x.extra["best"] for lp in lps)
    m = recipe.train(trainer, batch)
    assert m["best"] == 1.0 and m["units"] == 3 and m["loss"] == pytest.approx(best / 3, rel=1e-5)
