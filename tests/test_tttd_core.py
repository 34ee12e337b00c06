"""TTT-Discover's core (recipes/tttd) against hand-computed values: the entropic beta and its leave-one-out
advantages, the PUCT archive (scores, selection order, expansion, eviction, JSON resume), the sandbox's limits, the
circle-packing verifier and the scipy baseline, and the config's paper defaults. The `is` loss is in test_rl.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recipes.tttd import entropic
from recipes.tttd.archive import Archive
from recipes.tttd.config import ProblemConfig, TTTDConfig
from recipes.tttd.problems import (BEST_KNOWN, CircleCentres, CirclePacking, check_circles, extract_code,
                                   make_problem, program_for, scipy_baseline, solve_radii)
from recipes.tttd.sandbox import SandboxLimits, run_python
from reef_lab.trainers.base import TrainerConfig

LN2 = math.log(2)


# --- the entropic objective ------------------------------------------------------------------------------------

def test_entropic_beta_hits_ln2_against_an_independent_solution():
    """Rewards [0, 0, 1]: q_beta puts p = e^b / (2 + e^b) on the best and (1 - p) / 2 on each other, so
    KL(q || uniform) = p ln p + (1 - p) ln((1 - p) / 2) + ln 3. Solve that for p with brentq, then b = ln(2p / (1 - p))."""
    from scipy.optimize import brentq

    def kl_of_p(p):
        return p * math.log(p) + (1 - p) * math.log((1 - p) / 2) + math.log(3)

    p = brentq(lambda p: kl_of_p(p) - LN2, 1 / 3 + 1e-12, 1 - 1e-12, xtol=1e-15)
    beta_by_hand = math.log(2 * p / (1 - p))
    beta = entropic.solve_beta([0.0, 0.0, 1.0])
    assert beta == pytest.approx(beta_by_hand, rel=1e-9)
    assert entropic.kl_to_uniform([0.0, 0.0, 1.0], beta) == pytest.approx(LN2, abs=1e-12)
    # beta * r is what matters: shifting the rewards changes nothing, scaling them by 10 divides beta by 10
    assert entropic.solve_beta([5.0, 5.0, 6.0]) == pytest.approx(beta, rel=1e-9)
    assert entropic.solve_beta([0.0, 0.0, 10.0]) == pytest.approx(beta / 10, rel=1e-9)
    # a longer group, checked the same way (KL at the solution, and monotone in beta around it)
    rs = [0.1, 0.5, 0.52, 0.9, 0.3, 0.9, 0.0, 0.7]
    b = entropic.solve_beta(rs)
    assert entropic.kl_to_uniform(rs, b) == pytest.approx(LN2, abs=1e-10)
    assert entropic.kl_to_uniform(rs, 0.9 * b) < LN2 < entropic.kl_to_uniform(rs, 1.1 * b)


def test_leave_one_out_advantages_by_hand():
    """Rewards [0, 1, 2] at beta = ln 2: exp(beta (r - 2)) = [1/4, 1/2, 1].
    Z_-0 = (1/2 + 1) / 2 = 3/4 -> w = 1/3; Z_-1 = (1/4 + 1) / 2 = 5/8 -> w = 4/5; Z_-2 = (1/4 + 1/2) / 2 = 3/8 -> w = 8/3."""
    adv = entropic.loo_advantages([0.0, 1.0, 2.0], LN2)
    assert adv == pytest.approx([1 / 3 - 1, 4 / 5 - 1, 8 / 3 - 1], rel=1e-12)
    # group_advantages = loo at the solved beta, recomputed here with plain exponentials
    (got, beta) = entropic.group_advantages([0.0, 1.0, 2.0])
    e = [math.exp(beta * (r - 2.0)) for r in (0.0, 1.0, 2.0)]
    by_hand = [e[n] / ((sum(e) - e[n]) / 2) - 1 for n in range(3)]
    assert got == pytest.approx(by_hand, rel=1e-9)
    assert got[2] > 0 > got[1] > got[0]


def test_equal_reward_groups_are_dropped():
    assert entropic.group_advantages([0.5, 0.5, 0.5, 0.5]) is None
    assert entropic.solve_beta([2.0] * 64) is None
    assert entropic.group_advantages([1.0]) is None


def test_unreachable_targets():
    """Two distinct rewards: KL -> ln 2 only as beta -> infinity. The search stops at beta_max and the group is
    refused (the better rollout's weight would be exp(beta_max)). Ties at the max keep the weights finite."""
    assert entropic.kl_supremum([0.0, 1.0]) == pytest.approx(LN2)
    assert entropic.kl_to_uniform([0.0, 1.0], 5.0) < entropic.kl_to_uniform([0.0, 1.0], 10.0) < LN2
    assert entropic.solve_beta([0.0, 1.0]) == entropic.BETA_MAX
    with pytest.raises(ValueError, match="at least 3 rollouts"):
        entropic.group_advantages([0.0, 1.0])
    # [0, 0, 1, 1]: supremum ln(4 / 2) = ln 2, beta = beta_max; Z_-0 = (0 + 1 + 1) / 3 -> A = -1; Z_-2 = 1/3 -> A = 2
    adv, beta = entropic.group_advantages([0.0, 0.0, 1.0, 1.0])
    assert beta == entropic.BETA_MAX
    assert adv == pytest.approx([-1.0, -1.0, 2.0, 2.0], abs=1e-12)


# --- the PUCT archive --------------------------------------------------------------------------------------------

def hand_built(c: float = 1.0) -> Archive:
    """Two initial states a (0.5) and b (0.3); a expanded to a1 (0.7), a2 (0.6) (0.4 falls outside the top 2);
    a1 expanded to a3 (0.65) and one invalid rollout. T = 2, n(a) = 2, n(a1) = 1, m(a) = 0.7, m(a1) = 0.65."""
    arch = Archive(c=c, max_size=100)
    a = arch.add_initial("A", 0.5)
    arch.add_initial("B", 0.3)
    a1, a2 = arch.expand(a.id, [("A1", 0.7), ("A2", 0.6), ("A4", 0.4)], step=0)
    arch.expand(a1.id, [("A3", 0.65), ("broken", None)], step=1)
    return arch


def test_archive_puct_scores_by_hand():
    arch = hand_built()
    by_solution = {e.state.solution: e for e in arch.scores()}
    assert set(by_solution) == {"A", "B", "A1", "A2", "A3"}
    # scale = 0.7 - 0.6 over the non-initial states; rank weights 5..1 over 15: A1 5, A3 4, A2 3, A 2, B 1
    scale, root = 0.1, math.sqrt(1 + 2)
    expected = {  # solution: (Q, P, n)
        "A": (0.7, 2 / 15, 2), "A1": (0.65, 5 / 15, 1), "A2": (0.6, 3 / 15, 0), "A3": (0.65, 4 / 15, 0),
        "B": (0.3, 1 / 15, 0)}
    for sol, (q, p, n) in expected.items():
        e = by_solution[sol]
        assert (e.q, e.state.visits) == (pytest.approx(q), n), sol
        assert e.prior == pytest.approx(p) and e.bonus == pytest.approx(scale * p * root / (1 + n)), sol
        assert e.score == pytest.approx(q + scale * p * root / (1 + n)), sol
    # scores: A .70770, A3 .69619, A1 .67887, A2 .63464, B .31155
    assert [e.state.solution for e in arch.scores()] == ["A", "A3", "A1", "A2", "B"]
    # G = 2 distinct lineages: A blocks its whole tree, so the second parent is B
    assert [s.solution for s in arch.select(2)] == ["A", "B"]


def test_archive_selection_order_changes_with_c():
    """c = 10: bonuses x10: A .7770, A1 .9387, A2 .9464, A3 1.1119, B .4155. A3 first; it blocks A1 and A (its
    ancestors) but not its aunt A2."""
    arch = hand_built(c=10.0)
    assert [e.state.solution for e in arch.scores()] == ["A3", "A2", "A1", "A", "B"]
    assert [s.solution for s in arch.select(2)] == ["A3", "A2"]
    assert [s.solution for s in arch.select(4)] == ["A3", "A2", "B", "A3"]  # three lineages: the picks repeat


def test_archive_expansion_keeps_the_best_two_new_children_and_counts_visits():
    arch = Archive(max_size=100)
    root = arch.add_initial("R", 0.1)
    kept = arch.expand(root.id, [("x", 0.4), ("y", None), ("z", 0.9), ("R", 0.95), ("z", 0.9), ("w", 0.7)])
    assert [(s.solution, s.reward) for s in kept] == [("z", 0.9), ("w", 0.7)]  # "R" is already known
    assert root.best_child == 0.95 and root.visits == 1 and arch.expansions == 1
    assert root.children == [s.id for s in kept] and kept[0].ancestors == [root.id]
    grand = arch.expand(kept[0].id, [("q", None), ("r", None)])  # all invalid: counted, nothing kept
    assert grand == [] and kept[0].best_child is None and kept[0].visits == 1 and root.visits == 2
    assert arch.expansions == 2


def test_bounded_archive_evicts_the_lowest_never_an_initial_state():
    arch = Archive(max_size=4, children_per_expansion=3)
    root = arch.add_initial("R", 0.0)
    arch.expand(root.id, [("a", 0.5), ("b", 0.2), ("c", 0.9)])
    assert len(arch) == 4
    (d,) = arch.expand(root.id, [("d", 0.6)])
    assert sorted(s.solution for s in arch.states.values()) == ["R", "a", "c", "d"]  # b (0.2) went
    assert arch.best().solution == "c" and root.children == [s.id for s in arch.states.values() if s.parent]
    assert arch.expand(root.id, [("e", 0.1)]) == []  # below everything kept: evicted at once


def test_archive_resumes_from_json():
    arch = hand_built()
    again = Archive.from_dict(json.loads(json.dumps(arch.to_dict())))
    assert [(e.state.id, e.score) for e in again.scores()] == [(e.state.id, e.score) for e in arch.scores()]
    parent = arch.select(1)[0]
    a = arch.expand(parent.id, [("next", 0.8)])
    b = again.expand(parent.id, [("next", 0.8)])
    assert [s.id for s in a] == [s.id for s in b] and again.to_dict() == arch.to_dict()
    with pytest.raises(ValueError, match="schema"):
        Archive.from_dict({**arch.to_dict(), "schema": 99})


# --- the sandbox ---------------------------------------------------------------------------------------------------

FAST = SandboxLimits(cpu_seconds=1, wall_seconds=2.0, memory_mb=256, output_bytes=4096)


def test_sandbox_runs_a_good_program():
    r = run_python("import math\nprint(math.sqrt(2))", FAST)
    assert r.ok and r.stdout == f"{math.sqrt(2)}\n" and r.returncode == 0


def test_sandbox_kills_an_infinite_loop_within_its_cpu_limit():
    """A generous wall clock, so only the CPU limit can stop it (on a loaded machine 1 s of CPU takes longer)."""
    r = run_python("while True:\n    pass\n", SandboxLimits(cpu_seconds=1, wall_seconds=60.0))
    assert r.kind == "timeout" and not r.ok and "CPU time" in r.detail and r.seconds < 60.0


def test_sandbox_kills_a_sleeper_at_the_wall_clock():
    r = run_python("import time\ntime.sleep(60)\n", FAST)
    assert r.kind == "timeout" and "wall" in r.detail and r.seconds < FAST.wall_seconds + 2.0


def test_sandbox_refuses_a_memory_hog():
    r = run_python("block = bytearray(2 * 1024 ** 3)\nprint(len(block))\n", FAST)
    assert r.kind == "memory" and r.stdout == ""


def test_sandbox_crashes_floods_and_garbage_are_invalid(monkeypatch):
    assert run_python("raise SystemExit(3)", FAST).kind == "crash"
    crash = run_python("print('partial')\n1 / 0\n", FAST)
    assert crash.kind == "crash" and "ZeroDivisionError" in crash.detail and crash.stdout == ""
    assert run_python("while True:\n    print('x' * 100)\n", FAST).kind == "output"
    assert run_python("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe')\n", FAST).kind == "garbage"
    # the candidate sees none of the parent's environment
    monkeypatch.setenv("TTTD_SECRET", "do-not-leak")
    r = run_python("import os\nprint(os.environ.get('TTTD_SECRET'))\n", FAST)
    assert r.ok and r.stdout == "None\n"
    # and the parent is still fine
    assert run_python("print('alive')", FAST).stdout == "alive\n"


# --- circle packing --------------------------------------------------------------------------------------------

def reply(code: str) -> str:
    return f"Here is a better packing.\n```python\n{code}\n```\nDone."


def test_circle_packing_verifier_scores_valid_packings_exactly():
    p = CirclePacking(6)
    start = p.initial_solution()
    v = p.verify(reply(start))
    assert v.valid and v.kind == "ok" and v.reward == pytest.approx(6 * 0.0833, abs=1e-12)
    assert v.solution == start.strip()
    two = CirclePacking(2)
    touching = "print(0.25, 0.5, 0.25)\nprint(0.75, 0.5, 0.25)"  # tangent to each other and to the walls
    assert two.verify(reply(touching)).reward == pytest.approx(0.5)
    diagonal = 1 / (2 + math.sqrt(2))  # the optimum: r = 1 / (2 + sqrt 2) each, sum 2 - sqrt 2
    best = f"r = {diagonal!r}\nprint(r, r, r)\nprint(1 - r, 1 - r, r)"
    assert two.verify(reply(best)).reward == pytest.approx(BEST_KNOWN[2][0], abs=1e-9)
    msg = p.prompt(start, v.reward)[0]["content"]
    assert start.strip() in msg and f"{v.reward:.6f}" in msg


@pytest.mark.parametrize("code, kind, why", [
    ("print(0.25, 0.5, 0.25)\nprint(0.75 - 1e-6, 0.5, 0.25)", "infeasible", "overlap"),
    ("print(0.25, 0.5, 0.25)\nprint(0.8, 0.5, 0.25)", "infeasible", "leaves the unit square"),
    ("print(0.25, 0.5, 0.25)\nprint(0.75, 0.5, 0)", "infeasible", "<= 0"),
    ("print(0.25, 0.5, 0.25)", "infeasible", "expected 2 circles"),
    ("print('two circles, trust me')", "garbage", "three numbers"),
    ("print(0.25, 0.5, 'big')\nprint(0.75, 0.5, 0.25)", "garbage", "not numeric"),
    ("print(0.25, 0.5, float('nan'))\nprint(0.75, 0.5, 0.25)", "infeasible", "non-finite"),
    ("import nonexistent_module", "crash", "ModuleNotFoundError"),
])
def test_circle_packing_verifier_rejects_invalid_answers(code, kind, why):
    v = CirclePacking(2).verify(reply(code))
    assert (v.valid, v.kind, v.reward) == (False, kind, 0.0) and why in v.reason


def test_circle_packing_invalid_replies_never_raise():
    p = CirclePacking(2, limits=FAST)
    assert p.verify("I would place two circles side by side.").kind == "format"
    assert p.verify(reply("while True:\n    pass")).kind == "timeout"
    assert extract_code("```py\nfirst\n```\ntext\n```\nlast\n```") == "last"
    assert extract_code("```python\nunterminated = 1\n") == "unterminated = 1"
    assert check_circles([(0.5, 0.5, 0.5)], 1, 0.0) == ""


def test_scipy_baseline_reaches_a_valid_packing():
    res = scipy_baseline(5, seconds=2.0, seed=0)
    assert res.starts >= 1 and check_circles(res.circles, 5, 0.0) == ""
    assert res.best == pytest.approx(sum(r for _, _, r in res.circles))
    assert res.best > 0.99 * BEST_KNOWN[5][0]  # the grid start scores 0.5; 0.3 s already reaches the reference
    v = CirclePacking(5).verify(reply(program_for(res.circles, digits=12)))
    assert v.valid and v.reward == pytest.approx(res.best, abs=1e-9)


def test_radius_lp_by_hand():
    # two centres on the horizontal midline: walls allow 0.25 each and they touch; the LP gives exactly that
    assert solve_radii([(0.25, 0.5), (0.75, 0.5)]) == pytest.approx([0.25, 0.25], abs=1e-9)
    # close centres: the walls allow 0.4 and 0.4 but they are 0.2 apart, so the sum is 0.2
    assert sum(solve_radii([(0.4, 0.5), (0.6, 0.5)])) == pytest.approx(0.2, abs=1e-9)
    # four quarter centres (r = 1/4 each) and the middle one, which fits 0.25 * (sqrt 2 - 1) in the gap: the
    # optimum for n = 5 in BEST_KNOWN; a centre on the wall gets radius 0
    quarters = [(0.25, 0.25), (0.75, 0.25), (0.25, 0.75), (0.75, 0.75), (0.5, 0.5)]
    assert sum(solve_radii(quarters)) == pytest.approx(BEST_KNOWN[5][0], abs=1e-9)
    assert solve_radii([(0.0, 0.3), (0.5, 0.5)])[0] == 0.0


def test_circle_centres_verifier_scores_the_packing_of_the_stated_centres():
    p = CircleCentres(6, start_fill=0.3)
    start = p.initial_solution()
    v = p.verify(p.reply_for(start))
    # the crowded 3 x 2 grid 0.1 apart: the LP gives the six circles a sum of 0.3 (touching neighbours)
    assert v.valid and v.reward == pytest.approx(0.3, abs=1e-9) and v.solution == start
    assert check_circles(v.details["circles"], 6, 0.0, allow_zero=True) == ""
    assert p.circles(start) == v.details["circles"]
    msg = p.prompt(start, v.reward)[0]["content"]
    assert start in msg and "0.3000" in msg
    # a reply with chatter and extra code after the list: the first 6 pairs of the last block count, rounded to
    # 4 decimals, and the stored solution is the canonical list
    text = ("Sure!\n```python\ncentres = [(0.25, 0.25), (0.75, 0.25), (0.25, 0.75), (0.75, 0.75), (0.5, 0.5),\n"
            "           (0.000004, 0.0)]\ndef grow(c):\n    return (0.1, 0.2)\n```")
    v = CircleCentres(6).verify(text)
    assert v.valid and v.reward == pytest.approx(BEST_KNOWN[5][0], abs=1e-9)
    assert "(0.0000, 0.0000)" in v.solution and "grow" not in v.solution
    assert CircleCentres(6).verify(CircleCentres(6).reply_for(v.solution)).reward == v.reward


@pytest.mark.parametrize("text, kind, why", [
    ("Move them apart.", "format", "no ```python code block"),
    ("```python\ncentres = [(0.1, 0.1), (0.9, 0.9)]\n```", "garbage", "2 (x, y) pairs, 6 needed"),
    ("```python\n" + "(0.5, 0.5), " * 5 + "(1.2, 0.5)\n```", "infeasible", "centre 5 (1.2, 0.5) lies outside"),
    ("```python\n" + "(0.5, 0.5), " * 5 + "(-0.1, 0.5)\n```", "infeasible", "outside the unit square"),
    ("```python\n" + "(0.5, 0.5), " * 5 + "(0.5, 1e400)\n```", "infeasible", "outside the unit square"),
])
def test_circle_centres_verifier_rejects_invalid_answers(text, kind, why):
    v = CircleCentres(6).verify(text)
    assert (v.valid, v.kind, v.reward) == (False, kind, 0.0) and why in v.reason


def test_circle_centres_reaches_the_best_known_value_from_scipys_centres():
    res = scipy_baseline(6, seconds=3.0, seed=0)
    centres = ", ".join(f"({x!r}, {y!r})" for x, y, _ in res.circles)
    v = CircleCentres(6).verify(f"```python\n{centres}\n```")  # rounding to 4 decimals costs little
    assert v.valid and res.best - 2e-3 < v.reward <= BEST_KNOWN[6][0] + 1e-9


# --- the config ----------------------------------------------------------------------------------------------------

def test_config_defaults_are_the_papers_and_bad_combinations_are_refused():
    c = TTTDConfig()
    assert (c.groups, c.rollouts_per_group, c.steps, c.children_per_expansion) == (8, 64, 50, 2)
    assert (c.puct_c, c.kl_target, c.kl_coef, c.temperature) == (1.0, LN2, 0.1, 1.0)
    # nested configs are kept as the dataclasses they were validated as; the trainer's seed is the run's
    assert c.trainer == TrainerConfig(lora_rank=32, lr=4e-5) and c.problem_config == ProblemConfig()
    assert TTTDConfig(seed=3).trainer.seed == 3 and TTTDConfig(seed=3, trainer={"seed": 5, "lora_rank": 4}).trainer.seed == 5
    assert isinstance(make_problem(c.problem), CirclePacking) and make_problem({"n": 7}).n == 7
    for bad, words in [({"rollouts_per_group": 2}, "rollouts_per_group"), ({"archive_size": 8}, "archive_size"),
                       ({"trainer": {"lr": 1e-4}}, "lora_rank"), ({"trainer": {"lrr": 1.0}}, "trainer.lrr"),
                       ({"problem": {"n": 1}}, "problem.n"), ({"problem": {"name": "tsp"}}, "problem.name"),
                       ({"kl_target": 5.0}, "kl_target"), ({"puct_c": -1.0}, "puct_c")]:
        with pytest.raises(ValueError, match=words):
            TTTDConfig(**bad)
    assert TTTDConfig(kl_coef=0.0, trainer={"lr": 1e-4}).kl_coef == 0.0  # a full fine-tune without the KL term


def test_a_problem_is_named_by_module_class():
    p = make_problem({"name": "recipes.tttd.problems:CircleCentres", "n": 5, "start_fill": 0.5})
    assert isinstance(p, CircleCentres) and (p.n, p.start_fill) == (5, 0.5)
    assert isinstance(make_problem({"name": "circle_centres"}), CircleCentres)
    with pytest.raises(ValueError, match="problem.name .* cannot be loaded"):
        make_problem({"name": "recipes.tttd.problems:Nope"})
    with pytest.raises(ValueError, match="not a recipes.tttd.problems.Problem subclass"):
        make_problem({"name": "recipes.tttd.archive:Archive"})


@pytest.mark.parametrize("example", ["circle_packing_cpu.yaml", "circle_centres_cpu.yaml"])
def test_the_cpu_examples_are_valid_configs(example):
    import yaml

    from recipes.tttd.experiment import TTTDExperimentConfig

    data = yaml.safe_load(open(Path(__file__).parents[1] / "recipes/tttd/examples" / example))
    c = TTTDExperimentConfig(**data).recipe_config()
    assert c.problem_config.n in BEST_KNOWN and c.rollouts_per_group >= 3
    problem = make_problem(c.problem)
    assert problem.verify(problem.reply_for(problem.initial_solution())).valid
