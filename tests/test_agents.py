"""Real agent clients through reef_lab's relay to the scripted provider, in every dialect direction.

Claude Code (Anthropic messages), Codex CLI (OpenAI Responses) and opencode (OpenAI chat), the pinned npm versions
`bash scripts/setup.sh --agents` installs, each run headless by `reef_lab/testing/agents.py` through
`scripts/serve.py --upstream-url <scripted provider> [--upstream-dialect ...]`: against a provider of the client's own
dialect, and against providers of the two other dialects (the relay translates). Each run must complete the
scripted task (write a file with given content in its working folder, then answer in text), and every call must be
in the records, in order, with the tool call and its result. The agents run in process groups killed with the
test. Marker `agents` (not in the default run; .ci/run runs it).
"""

from __future__ import annotations

import orjson
import pytest

from reef_lab.testing import free_port
from reef_lab.testing.agents import RUNNERS, ReefServer, installed
from reef_lab.testing.scripted_provider import DONE_TEXT, ScriptedProvider

pytestmark = pytest.mark.agents

OWN = {"claude": "messages", "codex": "responses", "opencode": "chat"}
FLAG = {"messages": "anthropic", "chat": "openai-chat", "responses": "openai-responses"}
CLIENT_DIALECT = {"claude": "anthropic.messages", "codex": "openai.responses", "opencode": "openai.chat"}
DIALECT = {"messages": "anthropic.messages", "chat": "openai.chat", "responses": "openai.responses"}
ROUTE = {"anthropic.messages": "/v1/messages", "openai.chat": "/v1/chat/completions",
         "openai.responses": "/v1/responses"}
SESSION_HEADER = {"claude": "x-claude-code-session-id", "codex": "session-id", "opencode": "x-session-id"}
CASES = [(agent, provider) for agent in OWN for provider in ("messages", "chat", "responses")]


def tool_result_seen(path: str, body: dict) -> bool:
    if path == "/v1/responses":
        return any(isinstance(i, dict) and i.get("type", "").endswith("_output") for i in body.get("input") or [])
    return any(m.get("role") == "tool" or isinstance(m.get("content"), list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in m["content"]) for m in body["messages"])


@pytest.mark.parametrize("agent,speaks", CASES, ids=[f"{a}->{s}" for a, s in CASES])
def test_agent_completes_a_file_task_through_the_relay(tmp_path, agent, speaks):
    if not installed(agent):
        pytest.skip(f"{agent} is not installed: bash scripts/setup.sh --agents")
    translated = speaks != OWN[agent]
    content = f"reef-{agent}-{speaks}"
    work = tmp_path / "agent"
    target = work / "cwd" / "out.txt"
    target.parent.mkdir(parents=True)
    scenario = f"{agent}-{speaks}"
    with ScriptedProvider(speaks=(speaks,)) as provider, \
            ReefServer(provider.url, tmp_path / "data", free_port(),
                       dialect=FLAG[speaks] if translated else None) as reef:
        run = RUNNERS[agent](reef.url, f"REEF-TASK path={target} content={content}", work, scenario)
        records = reef.records(scenario)
        session = provider.requests[0]["headers"].get(SESSION_HEADER[agent])
        episode = reef.episode(scenario, session) if session else None
    assert run.returncode == 0, f"{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
    assert target.read_text().strip() == content
    assert DONE_TEXT in run.stdout
    calls = [r for r in provider.requests if r["method"] == "POST"]
    assert len(calls) >= 2 and tool_result_seen(calls[-1]["path"], calls[-1]["body"])
    assert all(c["headers"].get(SESSION_HEADER[agent]) for c in calls)  # the client's session id went on
    # every call is recorded, in order, in the client's dialect; the provider's side beside it when translated
    assert len(records) == len(calls)
    assert all(r["status"] == "ok" and r["dialect"] == CLIENT_DIALECT[agent] for r in records)
    if translated:
        assert all(r["metadata"]["upstream"]["dialect"] == DIALECT[speaks] for r in records)
    route = ROUTE[CLIENT_DIALECT[agent]]
    called = [i for i, r in enumerate(records) if content in orjson.dumps(r["response"]).decode()]
    answered = [i for i, r in enumerate(records) if tool_result_seen(route, r["request"])]
    assert called and answered and called[0] < answered[-1], "the tool call and its result are not both recorded"
    assert DONE_TEXT in orjson.dumps(records[answered[-1]]["response"]).decode()
    # the client's own session id groups every call of the run into one episode, in the order they were made
    assert {r["episode"] for r in records} == {session}
    assert [r["id"] for r in episode["records"]] == [r["id"] for r in sorted(
        records, key=lambda r: (r["created_at"], r["id"]))]
    assert [r["turn"] for r in episode["records"]] == list(range(1, len(records) + 1))
