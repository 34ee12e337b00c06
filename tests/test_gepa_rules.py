"""GEPA's selection and acceptance rules against hand-computed cases."""

from __future__ import annotations

import random
from collections import Counter

from recipes.gepa.pareto import (Candidate, accept, dominates, item_fronts, merge_pair, next_component, pareto_counts,
                                 select_parent)


def test_dominance():
    assert dominates([1, 1, 0], [1, 0, 0]) and not dominates([1, 0, 0], [1, 0, 0])
    assert not dominates([1, 0], [0, 1])


def test_pareto_counts_by_hand():
    pool = {0: [1, 0, 0, 1], 1: [1, 1, 0, 0], 2: [0, 0, 1, 0], 3: [1, 0, 0, 0]}
    # example 0: best {0,1,3}; 1: {1}; 2: {2}; 3: {0}. Candidate 3 is dominated by 0 and by 1: out.
    assert pareto_counts(pool) == {0: 2, 1: 2, 2: 1}
    # two copies: gepa 0.1.4 keeps one (the later of equal means), not both
    assert pareto_counts({0: [0.5, 0.5], 1: [0.5, 0.5]}) == {1: 2}


def test_item_fronts_by_hand():
    """The per-example fronts the app marks, as gepa 0.1.4's remove_dominated_programs leaves them (checked against
    gepa itself on 20,000 random pools when this was written)."""
    # candidate 1 is dominated by 0 (the same on item 0, worse on item 1): on no front, although it ties item 0
    assert item_fronts({0: [1, 1], 1: [1, 0.5]}) == [{0}, {0}]
    # item 2 every candidate scores 0 on: no candidate stays for it alone; the front ones keep it (selection weight)
    fronts = item_fronts({0: [1, 0, 0], 1: [0, 1, 0], 2: [0, 0, 0]})
    assert fronts == [{0}, {1}, {0, 1}] and pareto_counts({0: [1, 0, 0], 1: [0, 1, 0], 2: [0, 0, 0]}) == {0: 2, 1: 2}
    # not dominated score by score, yet every item c0 is best on has another best: gepa prunes it (lowest mean first)
    pool = {0: [1, 1, 0], 1: [1, 0, 1], 2: [0, 1, 1]}
    assert item_fronts(pool) == [{1}, {2}, {1, 2}]
    # nobody scores anywhere: one candidate stays, so a parent can still be drawn
    assert pareto_counts({0: [0, 0], 1: [0, 0]}) == {1: 2}


def test_select_parent_is_proportional_to_counts():
    pool = {0: [1, 0, 0, 1], 1: [1, 1, 0, 0], 2: [0, 0, 1, 0], 3: [1, 0, 0, 0]}
    rng = random.Random(0)
    drawn = Counter(select_parent(pool, rng) for _ in range(5000))
    assert set(drawn) == {0, 1, 2}
    assert abs(drawn[0] / 5000 - 0.4) < 0.03 and abs(drawn[2] / 5000 - 0.2) < 0.03


def test_acceptance_is_strict_on_the_minibatch():
    assert accept([1, 1, 0], [1, 0, 0]) and not accept([1, 0, 0], [0, 1, 0])


def test_round_robin():
    assert [next_component(["rules", "system_prompt"], i) for i in range(3)] == ["rules", "system_prompt", "rules"]


def test_merge_takes_each_changed_component_from_its_side():
    seed = Candidate(0, {"a": "a0", "b": "b0"})
    c1 = Candidate(1, {"a": "a1", "b": "b0"}, parents=[0], changed="a")
    c2 = Candidate(2, {"a": "a0", "b": "b2"}, parents=[0], changed="b")
    c3 = Candidate(3, {"a": "a3", "b": "b0"}, parents=[0], changed="a")
    c4 = Candidate(4, {"a": "a1", "b": "b4"}, parents=[1], changed="b")
    cands = {c.id: c for c in (seed, c1, c2, c3, c4)}
    assert merge_pair(cands, 1, 2) == {"a": "a1", "b": "b2"}
    assert merge_pair(cands, 1, 3) is None  # both changed 'a'
    assert merge_pair(cands, 1, 4) is None  # 4 descends from 1
    assert merge_pair(cands, 3, 4) is None  # 4 changed a (via 1) and b; 3 changed a
