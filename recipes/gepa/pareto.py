"""GEPA's selection arithmetic (arXiv 2507.19457), as plain functions that tests check by hand.

A candidate is a harness (a dict of component name -> text) with its per-example scores on the validation set.
- Pareto selection: for every validation example, the candidates with the best score on it; of those, the ones not
  dominated stay (as gepa 0.1.4 prunes them: `item_fronts`); a parent is drawn with chance proportional to the
  number of examples on whose front it stays.
- Acceptance: a child is kept only if it beats its parent on the minibatch it was made from (sum of scores,
  strictly greater); only then is it scored on the full validation set.
- Mutation picks components round-robin; a merge combines two candidates whose lineages changed different
  components since their common ancestor, taking each component from the side that changed it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Candidate:
    id: int
    components: dict[str, str]
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # per validation example
    changed: str | None = None  # the component its mutation rewrote (None: seed or merge)

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else 0.0


def dominates(a: list[float], b: list[float]) -> bool:
    return all(x >= y for x, y in zip(a, b, strict=True)) and any(x > y for x, y in zip(a, b, strict=True))


def item_fronts(pool: dict[int, list[float]]) -> list[set[int]]:
    """For each validation example, the candidates on the Pareto front for it, as gepa 0.1.4 computes them
    (`GEPAState.program_at_pareto_front_valset` pruned by `gepa_utils.remove_dominated_programs`): the candidates
    with the example's best score, less the dominated ones. A candidate is dominated when every example it is best on
    has another remaining candidate that is best on it too; they are removed one at a time, the lowest mean
    validation score first (ties: in order of first appearance on the fronts), until none is. So a copy of another
    candidate keeps no place, and an example every candidate scores the same on (0, say) keeps no one on the front
    who is not there for another example, unless no example tells the candidates apart."""
    if not pool:
        return []
    n = len(next(iter(pool.values())))
    best = []
    for i in range(n):
        top = max(s[i] for s in pool.values())
        best.append({c for c, s in pool.items() if s[i] == top})
    mean = {c: sum(s) / len(s) if s else 0.0 for c, s in pool.items()}
    order = sorted(dict.fromkeys(c for front in best for c in sorted(front)), key=lambda c: mean[c])
    dominated: set[int] = set()
    pruned = True
    while pruned:
        pruned = False
        for c in order:
            others = set(order) - dominated - {c}
            if c not in dominated and all(front & others for front in best if c in front):
                dominated.add(c)
                pruned = True
                break
    return [front - dominated for front in best]


def pareto_counts(pool: dict[int, list[float]]) -> dict[int, int]:
    """Each candidate on the front: on how many validation examples it is (its weight when a parent is drawn)."""
    counts: dict[int, int] = {}
    for front in item_fronts(pool):
        for c in front:
            counts[c] = counts.get(c, 0) + 1
    return dict(sorted(counts.items()))


def select_parent(pool: dict[int, list[float]], rng: random.Random) -> int:
    counts = pareto_counts(pool)
    ids = sorted(counts)
    return rng.choices(ids, weights=[counts[i] for i in ids], k=1)[0]


def accept(child_minibatch: list[float], parent_minibatch: list[float]) -> bool:
    return sum(child_minibatch) > sum(parent_minibatch)


def next_component(components: list[str], step: int) -> str:
    """Round-robin over the components (sorted names) by mutation step."""
    names = sorted(components)
    return names[step % len(names)]


def ancestors(cands: dict[int, Candidate], cid: int) -> set[int]:
    seen, todo = set(), [cid]
    while todo:
        c = todo.pop()
        if c not in seen:
            seen.add(c)
            todo += cands[c].parents
    return seen


def changed_since(cands: dict[int, Candidate], cid: int, ancestor: int) -> set[str]:
    """Components the mutations on the path from `ancestor` to `cid` rewrote."""
    out, todo = set(), [cid]
    while todo:
        c = todo.pop()
        if c == ancestor or c not in cands:
            continue
        if cands[c].changed:
            out.add(cands[c].changed)
        todo += [p for p in cands[c].parents if ancestor in ancestors(cands, p)]
    return out


def merge_pair(cands: dict[int, Candidate], a: int, b: int) -> dict[str, str] | None:
    """The merged components of a and b, or None when they share no ancestor, changed the same component, or one
    descends from the other."""
    common = ancestors(cands, a) & ancestors(cands, b)
    if not common or a in common or b in common:
        return None
    anc = max(common)  # the most recent common ancestor (ids grow with time)
    ca, cb = changed_since(cands, a, anc), changed_since(cands, b, anc)
    if not ca or not cb or ca & cb:
        return None
    merged = dict(cands[anc].components)
    merged.update({k: cands[a].components[k] for k in ca})
    merged.update({k: cands[b].components[k] for k in cb})
    return merged
