"""Real agents on installed harness releases: Claude Code, Codex CLI and opencode (pinned by `setup.sh --agents`),
started by `reef-lab agent <agent>` through `scripts/serve.py` (a gepa scenario, mode manual) to the scripted
provider, which logs every body and also plays the change-request proposer.

For each agent: after `install`, its first model request (opencode: the first with its tools; its title call comes
first) carries the installed rule and skill text, taken from its own files (serving does not apply the harness
again: the agent sends x-reef-harness); `report` lands on that session's calls; after `evolve "<text>" --wait` and
`update`, the next run's request carries the new rule and skill; after a rollback on the server and `update`, the
old text again. Marker `agents` (not in the default run).
"""

from __future__ import annotations

import json
import pytest
import requests

from reef_lab.testing.agents import BIN, HEADLESS, first_model_request, harness_server, installed, run_wrapper
from reef_lab.testing.scripted_provider import DONE_TEXT, ScriptedProvider

pytestmark = pytest.mark.agents

SEED = {"system_prompt.md": "You are a careful engineer.", "rules.md": "- RULE-ALPHA-7 run the tests before you stop",
        "skills/tidy.md": "---\nname: tidy\ndescription: SKILL-BETA-7 sort the imports\n---\nSort them."}


def bodies(provider: ScriptedProvider, since: int) -> list[str]:
    return [json.dumps(r["body"]) for r in provider.requests[since:] if r["method"] == "POST"]


def first_agent_request(agent: str, provider: ScriptedProvider, since: int) -> str:
    """The run's first model request (for opencode the first that carries its tools)."""
    first = first_model_request(agent, provider.requests[since:])
    assert first, "the agent made no model request"
    return json.dumps(first["body"])


@pytest.mark.parametrize("agent", ["claude", "codex", "opencode", "pi"])
def test_installed_harness_reaches_the_model_and_evolves(tmp_path, agent):
    if not installed(agent):
        pytest.skip(f"{agent} is not installed: bash scripts/setup.sh --agents")
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    with ScriptedProvider() as provider:
        with harness_server(provider.url, tmp_path, SEED) as reef:
            requests.post(reef.url + "/reef/scenarios", json={"name": "s"}).raise_for_status()  # its seed: s:v1

            def wrapper(*args: str):
                return run_wrapper(agent, list(args), home, cwd)

            def run_task(word: str) -> tuple[str, list[str]]:
                target = cwd / f"{word}.txt"
                since = len(provider.requests)
                run = wrapper("--bin", str(BIN / agent), "--", *HEADLESS[agent](
                    f"REEF-TASK path={target} content={word}"))
                assert run.returncode == 0, f"{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
                assert target.read_text().strip() == word and DONE_TEXT in run.stdout
                return first_agent_request(agent, provider, since), bodies(provider, since)

            out = wrapper("install", "--url", reef.url, "--scenario", "s")
            assert out.returncode == 0 and "installed s:v1" in out.stdout, out.stderr
            first, all_calls = run_task("one")
            assert "RULE-ALPHA-7" in first and "SKILL-BETA-7" in first
            assert "Rules:" not in first  # serving's own rendering of the harness is absent: not applied again
            records = reef.records("s")
            session = records[-1]["tags"]["session"]
            ours = [r for r in records if r["tags"].get("session") == session]
            assert len(ours) == len(all_calls) and all(r["release_id"] == "s:v1" for r in ours)

            rep = wrapper("report", "--score", "0", "--feedback", "REEF-FEEDBACK-7 it did not log the change")
            assert rep.returncode == 0 and f"({len(ours)} calls)" in rep.stdout, rep.stderr
            report = reef.records("s")[-1]
            assert report["kind"] == "report" and sorted(report["references"]) == sorted(r["id"] for r in ours)

            wish = f"REEF-EVOLVED-7 log every change in CHANGES.md ({agent})"
            evo = wrapper("evolve", wish, "--wait", "--timeout", "300")
            assert evo.returncode == 0 and "released s:v2" in evo.stdout, f"{evo.stdout}\n{evo.stderr}"
            proposer = [b for b in bodies(provider, 0) if "harness proposer" in b][-1]
            assert "REEF-FEEDBACK-7" in proposer and "RULE-ALPHA-7" in proposer  # the session and its feedback
            up = wrapper("update")
            assert up.returncode == 0 and "installed s:v2" in up.stdout, up.stderr
            second, _ = run_task("two")
            assert "REEF-EVOLVED-7" in second and "RULE-ALPHA-7" in second
            assert "Use when: REEF-EVOLVED-7" in second  # the new skill's description, from its SKILL.md

            requests.post(reef.url + "/reef/scenarios/s/rollback", json={"release_id": "v1"}).raise_for_status()
            up = wrapper("update")
            assert up.returncode == 0 and "installed s:v1" in up.stdout and "removed skill" in up.stdout, up.stdout
            third, _ = run_task("three")
            assert "RULE-ALPHA-7" in third and "SKILL-BETA-7" in third and "REEF-EVOLVED-7" not in third
            assert reef.records("s")[-1]["release_id"] == "s:v1"
