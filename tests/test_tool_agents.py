"""Tool loops (call -> tool result -> final answer) on the real SmolLM2 behind `scripts/serve.py`: the official OpenAI
SDK (chat and Responses), the Anthropic SDK, streaming and not, and the OpenAI Agents SDK (`openai-agents`, when
installed) running a function tool.

SmolLM2-135M was not trained on tool calls (docs/tools.md says what it does); these prompts are ones where it
reliably writes a valid call (greedy): asked to reply with exactly a `<tool_call>` line, or with the function named
by `tool_choice` (prefilled). After the tool result it answers in text (it echoes the `<tool_response>`), which ends
the loop. What is checked is the serving side: valid calls reach each client in its own shape, the result goes back
into the prompt, and the records keep both turns with their calls.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from reef_lab.testing import free_port, wait_http
from tests.test_tool_calls import Client
from tests.tool_model import COPY

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[1]
NAMED = {"chat": {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
         "responses": {"tool_choice": {"type": "function", "name": "get_weather"}},
         "anthropic": {"tool_choice": {"type": "tool", "name": "get_weather"}}}


@pytest.fixture(scope="module")
def serve_py(tmp_path_factory):
    port, data = free_port(), tmp_path_factory.mktemp("agents")
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "serve.py"), "--port", str(port), "--data-dir",
                             str(data), "--log-level", "warning"], cwd=ROOT, start_new_session=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/healthz", timeout=600)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def records(url: str, scenario: str) -> list[dict]:
    import requests

    r = requests.get(f"{url}/reef/scenarios/{scenario}/records", params={"kind": "inference"}, timeout=30)
    return r.json()["records"]


def short(client: Client, session: str | None = None):
    """The SDK client of tests/test_tool_calls.py, with time for SmolLM2 on a busy 2-core CPU (and a session)."""
    headers = {"x-reef-session": session} if session else {}
    client.oai = client.oai.with_options(timeout=900, default_headers=headers)
    client.an = client.an.with_options(timeout=900, default_headers=headers)
    return client


def episode(url: str, scenario: str, session: str) -> dict:
    import requests

    r = requests.get(f"{url}/reef/episodes/{session}", headers={"x-reef-scenario": scenario}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
def test_sdk_tool_loop_on_smollm2(serve_py, dialect, stream):
    scenario = f"loop-{dialect}-{stream}"
    c = short(Client(serve_py, dialect, scenario), session=f"session-{scenario}")
    history = [c.user(COPY)]
    text, calls, finish = c.ask(history, stream)
    assert [(n, a) for _, n, a in calls] == [("get_weather", {"city": "Paris"})], (text, calls)
    history += c.answered(calls, text, ["sunny, 21 C"])
    final, calls2, finish2 = c.ask(history, stream)
    assert final and calls2 == [], (final, calls2)  # SmolLM2 echoes the tool response as its answer
    first, second = records(serve_py, scenario)
    assert first["metadata"]["tool_calls"] == [{"id": calls[0][0], "name": "get_weather", "arguments": {"city": "Paris"}}]
    assert second["metadata"] == {"tool_calls": []} and second["status"] == "ok"
    # the second prompt continues the first (up to its closing `<|im_start|>assistant\n`, 3 tokens)
    opening = len(first["prompt_token_ids"]) - 3
    assert second["prompt_token_ids"][:opening] == first["prompt_token_ids"][:opening]
    # one episode: both calls in order, with their tool calls
    ep = episode(serve_py, scenario, f"session-{scenario}")
    assert [(r["turn"], r["id"]) for r in ep["records"]] == [(1, first["id"]), (2, second["id"])]
    assert ep["records"][0]["metadata"]["tool_calls"][0]["name"] == "get_weather"


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
def test_named_tool_choice_on_smollm2(serve_py, dialect):
    c = short(Client(serve_py, dialect, f"named-{dialect}"))
    text, calls, finish = c.ask([c.user('Call get_weather with {"city": "Paris"}.')], True, **NAMED[dialect])
    assert [(n, a) for _, n, a in calls] == [("get_weather", {"city": "Paris"})], (text, calls)
    [rec] = records(serve_py, f"named-{dialect}")
    assert rec["metadata"]["prefill"].startswith("<tool_call>") and rec["metadata"]["tool_calls"][0]["id"] == calls[0][0]


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_sdk_runs_a_function_tool(serve_py, api):
    agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed: pip install openai-agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    seen = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        seen.append(city)
        return "sunny, 21 C"

    client = AsyncOpenAI(base_url=serve_py + "/v1", api_key="x", timeout=900, max_retries=0,
                         default_headers={"x-reef-scenario": f"agents-{api}", "x-reef-session": f"run-{api}"})
    model = (agents.OpenAIChatCompletionsModel if api == "chat" else agents.OpenAIResponsesModel)(
        model="SmolLM2-135M-Instruct", openai_client=client)
    agent = agents.Agent(name="weather", tools=[get_weather], model=model,
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=40))
    result = agents.Runner.run_sync(agent, COPY, max_turns=3)
    assert seen == ["Paris"] and "sunny" in result.final_output
    first, second = records(serve_py, f"agents-{api}")
    assert first["metadata"]["tool_calls"][0]["arguments"] == {"city": "Paris"}
    sent = first["request"]["tools"][0]
    assert (sent.get("function") or sent)["name"] == "get_weather"
    assert json.dumps(second["request"]).count("sunny, 21 C") == 1
    # the run is one episode: its calls in order, the tool call in turn 1, its result in turn 2's request
    ep = episode(serve_py, f"agents-{api}", f"run-{api}")
    assert [(r["turn"], r["id"]) for r in ep["records"]] == [(1, first["id"]), (2, second["id"])]
    assert ep["records"][0]["metadata"]["tool_calls"][0]["arguments"] == {"city": "Paris"}
