"""GEPA's loop on a scripted system and scripted reflection: acceptance, validation, budget, cache, merge, resume.

The system scores an example 1 when the harness holds the skill the example needs ("ALPHA" in system_prompt.md for
a-examples, "BETA" in rules.md for b-examples); the reflection model writes the skill of the component it is asked
about. Every expectation below follows from those two rules by hand.
"""

from __future__ import annotations

import pytest

from recipes.gepa.search import GEPAConfig, Rollout, Search, extract_text, read_events

SEED = {"system_prompt.md": "You are a helpful assistant.", "rules.md": "Be accurate."}


class ScriptedSystem:
    def __init__(self):
        self.rollouts = 0

    def run(self, components, examples):
        self.rollouts += len(examples)
        out = []
        for e in examples:
            ok = ("ALPHA" in components["system_prompt.md"]) if e["id"].startswith("a") else \
                ("BETA" in components["rules.md"])
            out.append(Rollout(e["id"], 1.0 if ok else 0.0, "42", "right" if ok else "wrong", e["id"]))
        return out


class ScriptedReflection:
    def __init__(self):
        self.prompts = []

    def complete(self, messages, **params):
        prompt = messages[-1]["content"]
        self.prompts.append(prompt)
        return "```\nALPHA: say it\n```" if "`system_prompt.md`" in prompt.split("\n")[0] else "BETA: rule"


def examples(prefix, n):
    return [{"id": f"{prefix}{i}"} for i in range(n)]


def make(tmp_path, **cfg):
    system, refl = ScriptedSystem(), ScriptedReflection()
    train = examples("a", 3) + examples("b", 3)
    val = [{"id": "a-val0"}, {"id": "a-val1"}, {"id": "b-val0"}, {"id": "b-val1"}]
    config = GEPAConfig(**{"max_metric_calls": 60, "minibatch_size": 2, "seed": 0, **cfg})
    return Search(config, system, refl, train, val, SEED, tmp_path / "run"), system, refl


def test_seed_scored_on_validation_and_budget_counts_every_rollout(tmp_path):
    s, system, _ = make(tmp_path)
    seed = s.start()
    assert seed.scores == [0.0, 0.0, 0.0, 0.0] and s.metric_calls == 4 == system.rollouts
    s.run(progress=False)
    assert s.metric_calls == system.rollouts  # cached rollouts cost nothing
    # it stops at the budget, or earlier once a perfect harness leaves nothing to reflect on (no call is spent)
    assert s.metric_calls >= 60 or s.best().mean == 1.0
    for ev in read_events(tmp_path / "run"):
        if ev["event"] == "iteration" and ev["kind"] == "mutation" and "child_scores" in ev:
            # a child is kept if and only if it beats its parent on the minibatch
            assert (ev["outcome"] == "accepted") == (sum(ev["child_scores"]) > sum(ev["parent_scores"]))


def test_mutations_rewrite_one_component_round_robin_and_reach_the_best(tmp_path):
    s, _, refl = make(tmp_path, max_metric_calls=200, use_merge=False)
    s.run(progress=False)
    for c in s.cands.values():
        if c.parents:  # a mutation: differs from its parent in exactly the component it changed
            parent = s.cands[c.parents[0]]
            assert [k for k in SEED if c.components[k] != parent.components[k]] == [c.changed]
    order = {}
    for ev in read_events(tmp_path / "run"):
        if ev["event"] == "iteration" and "component" in ev:
            order.setdefault(ev["parent"], []).append(ev["component"])
    for comps in order.values():  # per parent: rules.md, system_prompt.md, rules.md, ...
        assert comps == [("rules.md", "system_prompt.md")[i % 2] for i in range(len(comps))]
    best = s.best()
    assert best.components == {"system_prompt.md": "ALPHA: say it", "rules.md": "BETA: rule"}  # fences stripped
    assert best.scores == [1.0, 1.0, 1.0, 1.0]
    assert "Feedback: wrong" in refl.prompts[0]  # the reflection saw the parent's rollouts with their feedback


def test_merge_takes_each_component_from_the_lineage_that_changed_it(tmp_path):
    from recipes.gepa.pareto import Candidate

    s, system, _ = make(tmp_path)
    s.start()
    s.cands[1] = Candidate(1, {**SEED, "system_prompt.md": "ALPHA"}, [0], [1.0, 1.0, 0.0, 0.0], "system_prompt.md")
    s.cands[2] = Candidate(2, {**SEED, "rules.md": "BETA"}, [0], [0.0, 0.0, 1.0, 1.0], "rules.md")
    s._merge_due = True
    before = system.rollouts
    ev = s.step()
    assert ev["kind"] == "merge" and ev["parents"] == [1, 2] and ev["outcome"] == "accepted"
    merged = s.cands[ev["child"]]
    assert merged.parents == [1, 2] and merged.components == {"system_prompt.md": "ALPHA", "rules.md": "BETA"}
    assert merged.scores == [1.0, 1.0, 1.0, 1.0]
    # parents and merge on a minibatch of 2, then the merge on the 4 validation examples
    assert system.rollouts - before == 2 + 2 + 2 + 4 == s.metric_calls - 4


def test_perfect_parent_skips_reflection(tmp_path):
    s, _, refl = make(tmp_path)
    s.start()
    perfect = {"system_prompt.md": "ALPHA", "rules.md": "BETA"}
    s.cands[0].components = perfect
    s.cache.clear()
    ev = s.step(minibatch=[{"id": "a0"}, {"id": "b0"}])
    assert ev["outcome"] == "parent_perfect" and refl.prompts == []


def test_observed_rollouts_are_free(tmp_path):
    s, system, _ = make(tmp_path)
    s.start()
    before = system.rollouts
    s.observe(SEED, Rollout("a0", 0.0, "7", "the user says: wrong", "q"))
    s.observe(SEED, Rollout("a1", 0.0, "8", "the user says: wrong", "q"))
    s.evaluate(SEED, [{"id": "a0"}, {"id": "a1"}])
    assert system.rollouts == before and s.metric_calls == 4


def test_resume_keeps_pool_budget_and_cache(tmp_path):
    s, _, _ = make(tmp_path, max_metric_calls=30)
    s.run(progress=False)
    again, system, _ = make(tmp_path, max_metric_calls=30)
    assert again.metric_calls == s.metric_calls and len(again.cands) == len(s.cands)
    assert {c.id: c.scores for c in again.cands.values()} == {c.id: c.scores for c in s.cands.values()}
    again.evaluate(s.cands[0].components, again.valset)
    assert system.rollouts == 0  # already known
    assert again.rng.random() == s.rng.random()


def test_components_must_exist():
    with pytest.raises(ValueError, match="not files of the seed harness"):
        Search(GEPAConfig(components=["skills/x.md"]), ScriptedSystem(), ScriptedReflection(), [], [{"id": "v"}],
               SEED)


@pytest.mark.parametrize("reply,text", [("```\nA\nB\n```\nmore", "A\nB"), ("```md\nX\n", "X"), ("plain", "plain"),
                                        ("```\n\n```", None)])
def test_extract_text(reply, text):
    assert extract_text(reply) == text
