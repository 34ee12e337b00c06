"""The real Codex CLI on an engine that generates (not the relay): its hosted and freeform tools mapped both ways.

Codex 0.171 (the pinned `bash scripts/setup.sh --agents`) sends, besides function tools, a `namespace` of functions
(`multi_agent_v1`), a hosted `web_search` tool, and, for a model whose catalog entry says so, a freeform (`custom`)
`apply_patch`. The engines refused all of them; now the model is offered functions and its calls go back as the items
Codex expects (reef_lab/wire/responses_tools.py). Codex runs headless (`codex exec --json`, reef_lab/testing/agents.py)
against reef_lab in-process over loopback, serving reef_lab/testing/scripted_engine.py: prompts from the engines' own
chat template, a scripted answer in the model's `<tool_call>` words. The task takes three model turns: write a file
(apply_patch when offered, else the shell), read it back upper-cased through Codex's shell tool, answer with what the
shell printed. Checked: Codex applied the patch and ran the command itself, the third turn's prompt held the
command's output, the records keep every turn with its calls and the hosted tool they dropped, in one episode.

Cases: `default` (Codex's config as in tests/test_agents.py: an unknown model, shell `exec_command`, ~9k tokens of
prompt) and `catalog` (a `model_catalog_json` entry for the served model with short base instructions and a freeform
apply_patch, what docs/tools.md suggests for a small model: ~5k tokens). Marker `agents` (not in the default run).
"""

from __future__ import annotations

import json

import orjson
import pytest

from reef_lab.testing.agents import episode_of, installed, records_of, run_codex
from reef_lab.testing.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.agents

CATALOG_ENTRY = {
    "slug": "scripted-model", "display_name": "scripted-model", "description": None,
    "base_instructions": "You are a coding agent. Use the tools to do the user's task, then say what you did.",
    "shell_type": "shell_command", "apply_patch_tool_type": "freeform", "context_window": 8192,
    "supported_reasoning_levels": [], "supports_reasoning_summaries": False, "support_verbosity": False,
    "default_verbosity": None, "truncation_policy": {"mode": "bytes", "limit": 10000},
    "supports_parallel_tool_calls": True, "experimental_supported_tools": [], "visibility": "list",
    "supported_in_api": True, "priority": 0, "upgrade": None}


def events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def items(run_events: list[dict], kind: str) -> list[dict]:
    return [e["item"] for e in run_events if e.get("type") == "item.completed" and e["item"]["type"] == kind]


@pytest.mark.parametrize("setup", ["default", "catalog"])
def test_codex_runs_a_shell_task_on_a_generating_engine(tmp_path, serve, tokenizer, setup):
    if not installed("codex"):
        pytest.skip("codex is not installed: bash scripts/setup.sh --agents")
    settings = ""
    if setup == "catalog":
        (tmp_path / "catalog.json").write_text(json.dumps({"models": [CATALOG_ENTRY]}))
        settings = f'model_catalog_json = "{tmp_path / "catalog.json"}"\n'
    engine = ScriptedEngine(tokenizer)
    server = serve(engine)
    work, content, scenario = tmp_path / "agent", f"reef-codex-{setup}", f"codex-engine-{setup}"
    target = work / "cwd" / "out.txt"
    target.parent.mkdir(parents=True)
    run = run_codex(server.url, f"REEF-TASK path={target} content={content}", work, scenario, settings=settings)
    seen = events(run.stdout)
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    # Codex applied the patch (catalog) or ran the shell (default) to write the file, then ran the shell to read it
    assert target.read_text().strip() == content
    if setup == "catalog":
        assert [c["status"] for c in items(seen, "file_change")] == ["completed"]
    shells = items(seen, "command_execution")
    assert shells and shells[-1]["exit_code"] == 0 and content.upper() in shells[-1]["aggregated_output"]
    assert items(seen, "agent_message")[-1]["text"].endswith(f"The file says {content.upper()}.")
    # the model's last turn saw the shell's output (only it holds the upper-cased word)
    first, second, third = engine.requests
    assert content.upper() in third.messages[-1]["content"] and third.messages[-1]["role"] == "tool"
    offered = {t["function"]["name"] for t in first.tool_use.tools}
    assert "multi_agent_v1__spawn_agent" in offered and ("apply_patch" in offered) == (setup == "catalog")
    assert first.dropped and all("web_search" in d or "tool_search" in d for d in first.dropped)
    # the records: three ok turns in the Responses dialect, each call with its item type, the hosted tools dropped
    records = records_of(server.url, scenario)
    assert [r["status"] for r in records] == ["ok"] * 3 and {r["dialect"] for r in records} == {"openai.responses"}
    calls = [[c["name"] for c in r["metadata"]["tool_calls"]] for r in records]
    assert calls == [["apply_patch" if setup == "catalog" else "exec_command"], ["exec_command"], []]
    assert all(any("(web_search: a hosted tool" in d for d in r["metadata"]["dropped"]) for r in records)
    kinds = [[o["type"] for o in r["response"]["output"]] for r in records]
    assert kinds[0] == ["message", "custom_tool_call" if setup == "catalog" else "function_call"]
    assert kinds[1] == ["message", "function_call"] and kinds[2] == ["message"]
    sent = [[i.get("type", "message") for i in r["request"]["input"]] for r in records]
    assert ("custom_tool_call_output" in sent[1]) == (setup == "catalog") and "function_call_output" in sent[2]
    assert content.upper() in orjson.dumps(records[2]["request"]).decode()
    # one episode, keyed by Codex's session id, its turns in order
    assert len({r["episode"] for r in records}) == 1 and records[0]["episode"]
    ep = episode_of(server.url, scenario, records[0]["episode"])
    assert [(r["turn"], r["id"]) for r in ep["records"]] == [(i + 1, r["id"]) for i, r in enumerate(records)]
