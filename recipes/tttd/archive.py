"""TTT-Discover's archive of states and its PUCT rule for choosing which states to continue from.

Why: TTT-Discover (arXiv 2601.16175) does not restart every rollout from the problem's empty start: each step it
picks G parent states (solutions with their rewards) from an archive and samples R continuations of each, so good
solutions are refined over many steps (a longer effective horizon) while less-tried ones still get a turn. Which
parents: the highest PUCT scores

    score(s) = Q(s) + c * scale * P(s) * sqrt(1 + T) / (1 + n(s))

- Q(s): the max reward among the children s produced (what s leads to, not the mean), or R(s) while no expansion of s
  produced a valid child;
- P(s): a rank prior, (N - rank(s)) / sum_k k, rank 0 = the highest reward, over the N states in the archive;
- n(s): expansions of s or of any descendant of s (each expansion counts once for the parent and every ancestor);
- T: all expansions so far; c: the exploration constant (paper: 1.0);
- scale: max R - min R over the archive's non-initial states (the authors' code; it makes c independent of the
  reward's units; `scale_by_range=False` gives the unscaled form).

The G parents are distinct lineages: once a state is picked, its ancestors and descendants are skipped, so the step's
groups do not all refine one branch. An expansion keeps only its best `children_per_expansion` (2) valid children
that are not already in the archive; past `max_size` states the lowest rewards are evicted, never an initial state
(nor the best, which has the highest reward). Everything round-trips through JSON (`to_dict`/`from_dict`) so a run
resumes exactly.

Tests with hand-computed scores: `python -m pytest tests/test_tttd_core.py -q -k archive`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

SCHEMA = 1


@dataclass
class State:
    id: str
    solution: str
    reward: float
    parent: str | None = None
    ancestors: list[str] = field(default_factory=list)  # nearest first; kept after an ancestor is evicted
    children: list[str] = field(default_factory=list)  # kept children still in the archive
    visits: int = 0  # n(s)
    best_child: float | None = None  # max reward among the valid children s produced (m(s))
    initial: bool = False
    step: int = -1  # the policy step that produced it (-1: an initial state)
    info: dict = field(default_factory=dict)  # the problem's details (e.g. the verifier's message)


@dataclass(frozen=True)
class Scored:
    state: State
    score: float
    q: float
    prior: float
    bonus: float


class Archive:
    def __init__(self, c: float = 1.0, max_size: int = 1000, children_per_expansion: int = 2,
                 scale_by_range: bool = True):
        if not math.isfinite(c) or c < 0:
            raise ValueError(f"the PUCT constant c must be finite and >= 0, got {c}")
        if max_size < 1 or children_per_expansion < 1:
            raise ValueError("max_size and children_per_expansion must be at least 1")
        self.c, self.max_size = float(c), max_size
        self.children_per_expansion, self.scale_by_range = children_per_expansion, scale_by_range
        self.states: dict[str, State] = {}  # insertion order = creation order (ties break towards older)
        self.expansions = 0  # T
        self.next_id = 0

    def __len__(self) -> int:
        return len(self.states)

    def _new_id(self) -> str:
        self.next_id += 1
        return f"s{self.next_id - 1}"

    def add_initial(self, solution: str, reward: float, info: dict | None = None) -> State:
        """A starting state (the authors create one per group, so the first step already has G lineages)."""
        _finite(reward)
        if sum(s.initial for s in self.states.values()) >= self.max_size:
            raise ValueError(f"max_size {self.max_size} leaves no room beside the initial states")
        state = State(self._new_id(), solution, float(reward), initial=True, info=dict(info or {}))
        self.states[state.id] = state
        return state

    def best(self) -> State:
        if not self.states:
            raise ValueError("the archive is empty")
        return max(self.states.values(), key=lambda s: s.reward)  # first of equals: the oldest

    @staticmethod
    def q(state: State) -> float:
        return state.best_child if state.best_child is not None else state.reward

    def scale(self) -> float:
        if not self.scale_by_range:
            return 1.0
        pool = [s.reward for s in self.states.values() if not s.initial] or [s.reward for s in self.states.values()]
        return max(max(pool) - min(pool), 1e-6)

    def scores(self) -> list[Scored]:
        """Every state's PUCT score, best first (ties: the higher reward, then the older state)."""
        states = list(self.states.values())
        n = len(states)
        by_reward = sorted(range(n), key=lambda i: -states[i].reward)  # stable: equal rewards keep age order
        weight = [0] * n
        for rank, i in enumerate(by_reward):
            weight[i] = n - rank
        total = n * (n + 1) / 2
        scale, root = self.scale(), math.sqrt(1 + self.expansions)
        out = []
        for i, s in enumerate(states):
            prior = weight[i] / total
            bonus = self.c * scale * prior * root / (1 + s.visits)
            out.append(Scored(s, self.q(s) + bonus, self.q(s), prior, bonus))
        out.sort(key=lambda x: (-x.score, -x.state.reward))
        return out

    def lineage(self, state: State) -> set[str]:
        """The state, its ancestors and its descendants."""
        return {state.id, *state.ancestors, *(s.id for s in self.states.values() if state.id in s.ancestors)}

    def select(self, g: int) -> list[State]:
        """The g parents of the next step: the highest scores, one per lineage. When the archive holds fewer than g
        separate lineages (never after `add_initial` once per group), the picks repeat in score order."""
        if g < 1:
            raise ValueError(f"select needs g >= 1, got {g}")
        if not self.states:
            raise ValueError("the archive is empty: add the initial states first")
        picked, blocked = [], set()
        for entry in self.scores():
            if entry.state.id in blocked:
                continue
            picked.append(entry.state)
            blocked |= self.lineage(entry.state)
            if len(picked) == g:
                return picked
        return [picked[i % len(picked)] for i in range(g)]

    def expand(self, parent_id: str, children: list[tuple[str, float | None]], step: int = 0,
               infos: list[dict] | None = None) -> list[State]:
        """Record one expansion of `parent_id`: its rollouts as (solution, reward; None = invalid). Counts the visit
        (parent and ancestors) and T, updates the parent's best child, keeps the best `children_per_expansion` valid
        new solutions (equal rewards: the earlier rollout) and evicts past max_size. Returns the states kept."""
        parent = self.states.get(parent_id)
        if parent is None:
            raise KeyError(f"no state {parent_id!r} in the archive (evicted or never added)")
        infos = infos if infos is not None else [{} for _ in children]
        if len(infos) != len(children):
            raise ValueError("one info per child")
        self.expansions += 1
        for sid in [parent.id, *parent.ancestors]:
            if sid in self.states:
                self.states[sid].visits += 1
        valid = [(i, sol, float(r)) for i, (sol, r) in enumerate(children) if r is not None and _finite(r)]
        if valid:
            top = max(r for _, _, r in valid)
            parent.best_child = top if parent.best_child is None else max(parent.best_child, top)
        known = {s.solution for s in self.states.values()}
        fresh = []
        for i, sol, r in sorted(valid, key=lambda x: (-x[2], x[0])):
            if sol in known:
                continue
            known.add(sol)
            fresh.append((i, sol, r))
            if len(fresh) == self.children_per_expansion:
                break
        kept = []
        for i, sol, r in fresh:
            child = State(self._new_id(), sol, r, parent=parent.id, ancestors=[parent.id, *parent.ancestors],
                          step=step, info=dict(infos[i]))
            self.states[child.id] = child
            parent.children.append(child.id)
            kept.append(child)
        self._evict()
        return [s for s in kept if s.id in self.states]

    def _evict(self) -> None:
        if len(self.states) <= self.max_size:
            return
        states = list(self.states.values())
        keep = {s.id for s in states if s.initial}
        for s in sorted(states, key=lambda s: -s.reward):  # stable: among equal rewards the older stays
            if len(keep) >= self.max_size:
                break
            keep.add(s.id)
        self.states = {sid: s for sid, s in self.states.items() if sid in keep}
        for s in self.states.values():
            s.children = [c for c in s.children if c in self.states]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "c": self.c, "max_size": self.max_size,
                "children_per_expansion": self.children_per_expansion, "scale_by_range": self.scale_by_range,
                "expansions": self.expansions, "next_id": self.next_id,
                "states": [asdict(s) for s in self.states.values()]}

    @classmethod
    def from_dict(cls, data: dict) -> Archive:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"archive schema {data.get('schema')!r} is not {SCHEMA}")
        archive = cls(data["c"], data["max_size"], data["children_per_expansion"], data["scale_by_range"])
        archive.expansions, archive.next_id = int(data["expansions"]), int(data["next_id"])
        for s in data["states"]:
            state = State(**s)
            archive.states[state.id] = state
        return archive


def _finite(x: float) -> bool:
    if not math.isfinite(float(x)):
        raise ValueError(f"rewards must be finite (None marks an invalid rollout), got {x}")
    return True
