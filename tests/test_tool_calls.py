"""Tool calls served by the engines that learn, end to end: the official SDKs (and their streaming helpers) against
reef_lab on loopback, in all three dialects, streaming and not, on the embedded engine and SGLang's double.

The model is the tiny Llama taught the script of tests/tool_model.py in this session: its generations are real
(greedy, through the engine's own batching), and the engines' own code templates the prompt, parses the calls and
renders them. Each answer's record is checked against what the client received.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
import requests

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.engines.sglang import SGLangEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.testing.sglang_server import SGLangDouble, SGLangDoubleServer
from tests.conftest import Running
from tests.tool_model import PREFILL, WEATHER

PARAMS = WEATHER["function"]["parameters"]
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
                  "parameters": PARAMS}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Current weather in a city", "input_schema": PARAMS}
DIALECTS = ["chat", "responses", "anthropic"]


@pytest.fixture(scope="module")
def server(tool_model, tokenizer, tmp_path_factory):
    r = Running(Gateway(tmp_path_factory.mktemp("tools"), EmbeddedEngine(tool_model, tokenizer, "tiny", max_batch=8)))
    yield r
    r.stop()


class Client:
    """One dialect through its official SDK: `ask` returns (text, [(call id, name, arguments)], finish reason)."""

    def __init__(self, url: str, dialect: str, scenario: str, session: str | None = None):
        self.dialect, self.scenario = dialect, scenario
        h = {"x-reef-scenario": scenario, **({"x-reef-session": session} if session else {})}
        self.oai = openai.OpenAI(base_url=url + "/v1", api_key="x", default_headers=h, max_retries=0)
        self.an = anthropic.Anthropic(base_url=url, api_key="x", default_headers=h, max_retries=0)

    def ask(self, history: list, stream: bool, **choice):
        if self.dialect == "chat":
            kw = dict(model="m", messages=history, tools=[WEATHER], temperature=0, max_tokens=80, **choice)
            if stream:
                with self.oai.chat.completions.stream(**kw) as s:
                    for _ in s:
                        pass
                    out = s.get_final_completion()
            else:
                out = self.oai.chat.completions.create(**kw)
            msg = out.choices[0].message
            calls = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []]
            return msg.content, calls, out.choices[0].finish_reason
        if self.dialect == "responses":
            kw = dict(model="m", input=history, tools=[RESPONSES_TOOL], temperature=0, max_output_tokens=80, **choice)
            if stream:
                with self.oai.responses.stream(**kw) as s:
                    for _ in s:
                        pass
                    out = s.get_final_response()
            else:
                out = self.oai.responses.create(**kw)
            calls = [(o.call_id, o.name, json.loads(o.arguments)) for o in out.output if o.type == "function_call"]
            return out.output_text or None, calls, out.status
        kw = dict(model="m", max_tokens=80, messages=history, tools=[ANTHROPIC_TOOL], extra_body={"temperature": 0},
                  **choice)
        if stream:
            with self.an.messages.stream(**kw) as s:
                for _ in s:
                    pass
                out = s.get_final_message()
        else:
            out = self.an.messages.create(**kw)
        text = "".join(b.text for b in out.content if b.type == "text")
        calls = [(b.id, b.name, b.input) for b in out.content if b.type == "tool_use"]
        return text or None, calls, out.stop_reason

    def user(self, text: str) -> dict:
        return {"role": "user", "content": text}

    def answered(self, calls: list, text: str | None, results: list[str]) -> list:
        """The assistant turn that made `calls`, then their results, in this dialect's own shape."""
        if self.dialect == "chat":
            return [{"role": "assistant", "content": text, "tool_calls": [
                {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for i, n, a in calls]},
                *({"role": "tool", "tool_call_id": i, "content": r} for (i, _, _), r in zip(calls, results))]
        if self.dialect == "responses":
            return [*({"type": "function_call", "call_id": i, "name": n, "arguments": json.dumps(a)} for i, n, a in calls),
                    *({"type": "function_call_output", "call_id": i, "output": r} for (i, _, _), r in zip(calls, results))]
        return [{"role": "assistant", "content": [{"type": "tool_use", "id": i, "name": n, "input": a}
                                                  for i, n, a in calls]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": r}
                                             for (i, _, _), r in zip(calls, results)]}]


CALLED = {"chat": "tool_calls", "responses": "completed", "anthropic": "tool_use"}
ENDED = {"chat": "stop", "responses": "completed", "anthropic": "end_turn"}


def records(server, scenario: str) -> list[dict]:
    return server.gateway.list_records(scenario, "inference")["records"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_parallel_calls_with_text_reach_the_sdk_and_the_record(server, dialect, stream):
    scenario = f"par-{dialect}-{stream}"
    c = Client(server.url, dialect, scenario)
    text, calls, finish = c.ask([c.user("Weather in Paris and Rome?")], stream)
    assert text == "Checking both." and finish == CALLED[dialect]
    assert [(n, a) for _, n, a in calls] == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    prefix = "toolu_" if dialect == "anthropic" else "call_"
    assert all(i.startswith(prefix) for i, _, _ in calls) and len({i for i, _, _ in calls}) == 2
    [rec] = records(server, scenario)
    assert rec["status"] == "ok" and rec["prompt_token_ids"] and len(rec["token_ids"]) == len(rec["logprobs"])
    assert rec["metadata"] == {"tool_calls": [{"id": i, "name": n, "arguments": a} for i, n, a in calls]}
    generated = server.gateway.engine.tokenizer.decode(rec["token_ids"], skip_special_tokens=True)
    assert generated.startswith("Checking both.\n<tool_call>") and generated.count("</tool_call>") == 2


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_loop_call_result_answer(server, dialect, stream):
    scenario = f"loop-{dialect}-{stream}"
    c = Client(server.url, dialect, scenario)
    history = [c.user("Weather in Paris?")]
    text, calls, finish = c.ask(history, stream)
    assert text is None and [(n, a) for _, n, a in calls] == [("get_weather", {"city": "Paris"})]
    assert finish == CALLED[dialect]
    history += c.answered(calls, text, ["sunny, 21 C"])
    text, calls2, finish = c.ask(history, stream)
    assert (text, calls2, finish) == ("It is sunny in Paris.", [], ENDED[dialect])
    first, second = records(server, scenario)
    assert first["metadata"]["tool_calls"][0]["id"] == calls[0][0]
    assert second["metadata"] == {"tool_calls": []}
    # the second prompt holds the first answer's call and its result, as the template renders them
    prompt = server.gateway.engine.tokenizer.decode(second["prompt_token_ids"])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<|im_start|>tool\n<tool_response>\nsunny, 21 C\n</tool_response>" in prompt


@pytest.mark.parametrize("dialect, choice", [
    ("chat", {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    ("responses", {"tool_choice": {"type": "function", "name": "get_weather"}}),
    ("anthropic", {"tool_choice": {"type": "tool", "name": "get_weather"}}),
])
def test_named_tool_choice_is_enforced_by_a_prefill(server, dialect, choice):
    scenario = f"named-{dialect}"
    c = Client(server.url, dialect, scenario)
    for stream in (False, True):
        text, calls, finish = c.ask([c.user("Weather in Oslo?")], stream, **choice)
        assert text is None and [(n, a) for _, n, a in calls] == [("get_weather", {"city": "Oslo"})]
    rec = records(server, scenario)[0]
    tok = server.gateway.engine.tokenizer
    assert tok.decode(rec["prompt_token_ids"]).endswith("<|im_start|>assistant\n" + PREFILL)
    assert tok.decode(rec["token_ids"], skip_special_tokens=True) == '{"city": "Oslo"}}\n</tool_call>'
    assert rec["metadata"]["prefill"] == PREFILL and rec["metadata"]["tool_calls"][0]["arguments"] == {"city": "Oslo"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_call_that_does_not_parse_is_answered_as_text(server, dialect, stream):
    scenario = f"bad-{dialect}-{stream}"
    c = Client(server.url, dialect, scenario)
    text, calls, finish = c.ask([c.user("Broken call please")], stream)
    assert text == '<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>'
    assert calls == [] and finish == ENDED[dialect]
    [rec] = records(server, scenario)
    assert rec["status"] == "ok" and rec["metadata"]["tool_calls"] == []
    assert rec["metadata"]["tool_call_errors"][0]["error"].startswith("not JSON")


def test_tool_choice_none_leaves_the_tools_out_of_the_prompt(server):
    c = Client(server.url, "chat", "none")
    c.ask([c.user("Weather in Paris?")], False, tool_choice="none")
    c.oai.chat.completions.create(model="m", messages=[c.user("Weather in Paris?")], temperature=0, max_tokens=80)
    with_none, plain = records(server, "none")
    assert with_none["prompt_token_ids"] == plain["prompt_token_ids"]
    assert with_none["token_ids"] == plain["token_ids"]
    assert with_none["metadata"] == {"tool_calls": []} and plain["metadata"] is None


def test_bad_tool_input_is_a_400_in_the_dialects_shape(server):
    c = Client(server.url, "chat", "refusals")
    with pytest.raises(openai.BadRequestError, match="'tool_choice' names function 'nope'"):
        c.ask([c.user("x")], False, tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\].tool_call_id 'call_x' answers no tool call"):
        c.ask([c.user("x"), {"role": "tool", "tool_call_id": "call_x", "content": "r"}], True)
    with pytest.raises(anthropic.BadRequestError, match="input_schema"):
        c.an.messages.create(model="m", max_tokens=5, messages=[c.user("x")], tools=[{"name": "f"}])
    r = requests.post(server.url + "/v1/responses", headers={"x-reef-scenario": "refusals"},
                      json={"model": "m", "input": "x", "tools": "all"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "'tools' must be a list of tool objects"


def test_sglang_engine_serves_the_same_calls_and_records(server, tool_model_dir, tmp_path):
    """The SGLang engine (against its double, on the same weights) gives the same record: prompt, tokens, calls."""
    inner = EmbeddedEngine.from_path(str(tool_model_dir), max_batch=4)
    double = SGLangDoubleServer(SGLangDouble(inner, tool_model_dir))
    sg = Running(Gateway(tmp_path / "data", SGLangEngine(double.url, tool_model_dir)))
    try:
        for stream in (False, True):
            c = Client(sg.url, "chat", f"sg-{stream}")
            text, calls, finish = c.ask([c.user("Weather in Paris and Rome?")], stream)
            assert text == "Checking both." and len(calls) == 2 and finish == "tool_calls"
            [rec] = records(sg, f"sg-{stream}")
            [ref] = records(server, f"par-chat-{stream}") or [None]
            if ref is None:  # the embedded test did not run first in this session: serve the reference now
                Client(server.url, "chat", f"par-chat-{stream}").ask([c.user("Weather in Paris and Rome?")], stream)
                [ref] = records(server, f"par-chat-{stream}")
            assert rec["prompt_token_ids"] == ref["prompt_token_ids"] and rec["token_ids"] == ref["token_ids"]
            strip = lambda m: [{k: v for k, v in t.items() if k != "id"} for t in m["tool_calls"]]  # noqa: E731
            assert strip(rec["metadata"]) == strip(ref["metadata"])
    finally:
        sg.stop()
        double.shutdown()
        inner.close()
