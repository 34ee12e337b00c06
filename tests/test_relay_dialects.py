"""The relay in front of a provider that speaks another dialect (`--upstream-dialect`), driven by the real SDKs.

Every client dialect against every other provider dialect, streaming and not: a two-turn tool loop against the
scripted provider (turn 1 a file-writing tool call, turn 2 text after the tool result), the provider's errors in
the client's own shape, and the records: the client's request and the answer it got in its own dialect, the
provider's answer in `metadata.upstream`.
"""

from __future__ import annotations

import anthropic
import openai
import orjson
import pytest
import requests

from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.testing.scripted_provider import DONE_TEXT, ScriptedProvider
from reef_lab.wire import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES

SPEAKS = {ANTHROPIC: "messages", OPENAI_CHAT: "chat", OPENAI_RESPONSES: "responses"}
PATH = {ANTHROPIC: "/v1/messages", OPENAI_CHAT: "/v1/chat/completions", OPENAI_RESPONSES: "/v1/responses"}
PAIRS = [(c, u) for c in SPEAKS for u in SPEAKS if c != u]
TASK = "REEF-TASK path=/tmp/reef-relay-test.txt content=hello-relay"
PROPS = {"file_path": {"type": "string"}, "content": {"type": "string"}}
H = {"x-reef-scenario": "relay"}


@pytest.fixture
def provider():
    with ScriptedProvider(speaks=("chat", "responses", "messages")) as p:
        yield p


def start(serve, provider, upstream):
    return serve(UpstreamEngine(provider.url, timeout=10, upstream_dialect=upstream))


# ---- one tool loop per client dialect: (tool name, arguments, call id), then the final text -------------------------
def anthropic_loop(url: str, stream: bool):
    c = anthropic.Anthropic(base_url=url, api_key="k", default_headers=H)
    tools = [{"name": "Write", "description": "write a file", "input_schema": {"type": "object", "properties": PROPS}}]
    msgs = [{"role": "user", "content": TASK}]

    def turn():
        kw = dict(model="claude-x", max_tokens=300, messages=msgs, tools=tools)
        if stream:
            with c.messages.stream(**kw) as s:
                return s.get_final_message()
        return c.messages.create(**kw)
    first = turn()
    call = next(b for b in first.content if b.type == "tool_use")
    assert first.stop_reason == "tool_use"
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "written"}]}]
    second = turn()
    assert second.stop_reason == "end_turn"
    return (call.name, call.input, call.id), "".join(b.text for b in second.content if b.type == "text")


def chat_loop(url: str, stream: bool):
    c = openai.OpenAI(base_url=url + "/v1", api_key="k", default_headers=H)
    tools = [{"type": "function", "function": {"name": "write_file", "description": "write a file",
                                               "parameters": {"type": "object", "properties": {
                                                   "path": {"type": "string"}, "content": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": TASK}]

    def turn():
        kw = dict(model="gpt-x", messages=msgs, tools=tools)
        if stream:
            with c.chat.completions.stream(**kw) as s:
                return s.get_final_completion()
        return c.chat.completions.create(**kw)
    first = turn()
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    msgs += [choice.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "written"}]
    second = turn()
    assert second.choices[0].finish_reason == "stop"
    return (call.function.name, orjson.loads(call.function.arguments), call.id), second.choices[0].message.content


def responses_loop(url: str, stream: bool):
    c = openai.OpenAI(base_url=url + "/v1", api_key="k", default_headers=H)
    tools = [{"type": "function", "name": "exec_command", "description": "run a command", "strict": False,
              "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
    items = [{"role": "user", "content": TASK}]

    def turn():
        kw = dict(model="gpt-x", input=items, tools=tools)
        if stream:
            with c.responses.stream(**kw) as s:
                return s.get_final_response()
        return c.responses.create(**kw)
    first = turn()
    call = next(o for o in first.output if o.type == "function_call")
    assert first.status == "completed"
    items += [o.model_dump(exclude_none=True) for o in first.output] + [
        {"type": "function_call_output", "call_id": call.call_id, "output": "written"}]
    second = turn()
    return (call.name, orjson.loads(call.arguments), call.call_id), second.output_text


LOOPS = {ANTHROPIC: anthropic_loop, OPENAI_CHAT: chat_loop, OPENAI_RESPONSES: responses_loop}
EXPECTED = {ANTHROPIC: ("Write", {"file_path": "/tmp/reef-relay-test.txt", "content": "hello-relay"}),
            OPENAI_CHAT: ("write_file", {"path": "/tmp/reef-relay-test.txt", "content": "hello-relay"}),
            OPENAI_RESPONSES: ("exec_command", {"cmd": "printf '%s' hello-relay > /tmp/reef-relay-test.txt"})}


def tool_result_in(upstream: str, body: dict) -> object:
    """The tool result the provider received, in its own dialect."""
    if upstream == OPENAI_CHAT:
        return next(m for m in body["messages"] if m["role"] == "tool")
    if upstream == OPENAI_RESPONSES:
        return next(i for i in body["input"] if i.get("type") == "function_call_output")
    return next(b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]
                if b["type"] == "tool_result")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("client,upstream", PAIRS, ids=[f"{c}->{u}" for c, u in PAIRS])
def test_tool_loop_across_dialects(serve, provider, client, upstream, stream):
    p = start(serve, provider, upstream)
    (name, args, call_id), text = LOOPS[client](p.url, stream)
    assert (name, args) == EXPECTED[client]
    assert text == DONE_TEXT
    calls = provider.calls(PATH[upstream])
    assert len(calls) == 2 and len(provider.requests) == 2  # only the provider's own route was called
    assert all(bool(c["body"].get("stream")) == stream for c in calls)
    result = tool_result_in(upstream, calls[1]["body"])
    assert call_id in orjson.dumps(result).decode() and "written" in orjson.dumps(result).decode()
    recs = p.gateway.list_records("relay")["records"]
    assert [r["dialect"] for r in recs] == [client, client] and all(r["status"] == "ok" for r in recs)
    first = recs[0]
    assert first["request"]["model"] in ("claude-x", "gpt-x")  # the client's request, in its own dialect
    assert ("input" in first["request"]) == (client == OPENAI_RESPONSES)
    assert call_id in orjson.dumps(first["response"]).decode()  # the answer as the client got it
    up = first["metadata"]["upstream"]
    assert up["dialect"] == upstream and up["status"] == 200
    assert EXPECTED[client][0] in orjson.dumps(up["response"]).decode()  # the provider's own answer


def raw_events(resp) -> list[tuple[str | None, dict | str]]:
    out = []
    for block in resp.text.strip().split("\n\n"):
        name = next((ln[6:].strip() for ln in block.split("\n") if ln.startswith("event:")), None)
        data = "\n".join(ln[5:].strip() for ln in block.split("\n") if ln.startswith("data:"))
        out.append((name, data if data == "[DONE]" else orjson.loads(data)))
    return out


@pytest.mark.parametrize("client,upstream", PAIRS, ids=[f"{c}->{u}" for c, u in PAIRS])
def test_the_receipt_rides_on_the_clients_last_event(serve, provider, client, upstream):
    p = start(serve, provider, upstream)
    body = {ANTHROPIC: {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]},
            OPENAI_CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            OPENAI_RESPONSES: {"model": "m", "input": "hi"}}[client]
    r = requests.post(p.url + PATH[client], json={**body, "stream": True}, headers=H, timeout=30)
    assert r.status_code == 200
    events = raw_events(r)
    if client == OPENAI_CHAT:
        assert events[-1][1] == "[DONE]"
    last = events[-2][1] if client == OPENAI_CHAT else events[-1][1]
    receipt = last["reef"]["agent_record_id"]
    rec = p.gateway.get_record("relay", receipt)
    assert rec["metadata"]["upstream"]["dialect"] == upstream
    assert "ok" in orjson.dumps(rec["response"]).decode()  # the scripted answer, in the client's dialect


@pytest.mark.parametrize("client,upstream,status,error", [
    (ANTHROPIC, OPENAI_CHAT, 429, anthropic.RateLimitError),
    (ANTHROPIC, OPENAI_RESPONSES, 400, anthropic.BadRequestError),
    (OPENAI_CHAT, ANTHROPIC, 429, openai.RateLimitError),
    (OPENAI_RESPONSES, ANTHROPIC, 404, openai.NotFoundError),
    (OPENAI_RESPONSES, OPENAI_CHAT, 401, openai.AuthenticationError),
])
def test_provider_errors_reach_the_client_in_its_own_shape(serve, provider, client, upstream, status, error):
    p = start(serve, provider, upstream)
    fail = f"REEF-FAIL status={status}"
    with pytest.raises(error) as e:
        if client == ANTHROPIC:
            anthropic.Anthropic(base_url=p.url, api_key="k", default_headers=H, max_retries=0).messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": fail}])
        elif client == OPENAI_CHAT:
            openai.OpenAI(base_url=p.url + "/v1", api_key="k", default_headers=H, max_retries=0).chat.completions.create(
                model="m", messages=[{"role": "user", "content": fail}])
        else:
            openai.OpenAI(base_url=p.url + "/v1", api_key="k", default_headers=H, max_retries=0).responses.create(
                model="m", input=fail)
    assert e.value.status_code == status
    assert f"scripted failure {status}" in str(e.value)
    if client == ANTHROPIC:  # the whole body: {"type": "error", "error": {type, message}}
        assert e.value.body["type"] == "error" and e.value.body["error"]["message"].startswith("upstream provider")
    else:  # the SDK keeps the inner error object
        assert e.value.body["message"].startswith("upstream provider") and "type" in e.value.body
    if status == 429:
        assert e.value.response.headers["retry-after"] == "3"
    rec = p.gateway.list_records("relay")["records"][-1]
    assert rec["status"] == "refused" and rec["error"] == f"upstream answered HTTP {status}"  # 4xx: refused
    assert rec["metadata"]["upstream"]["status"] == status


def test_provider_5xx_is_a_502_in_the_clients_shape(serve, provider):
    p = start(serve, provider, OPENAI_CHAT)
    r = requests.post(p.url + "/v1/messages", headers=H, timeout=30, json={
        "model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "REEF-FAIL status=500"}]})
    assert r.status_code == 502 and r.json()["type"] == "error" and "HTTP 500" in r.json()["error"]["message"]


@pytest.mark.parametrize("client,upstream", [(ANTHROPIC, OPENAI_CHAT), (OPENAI_CHAT, OPENAI_RESPONSES),
                                             (OPENAI_RESPONSES, ANTHROPIC)])
def test_a_stream_the_provider_breaks_off_ends_with_the_clients_error_event(serve, provider, client, upstream):
    p = start(serve, provider, upstream)
    body = {ANTHROPIC: {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "REEF-FAIL-STREAM"}]},
            OPENAI_CHAT: {"model": "m", "messages": [{"role": "user", "content": "REEF-FAIL-STREAM"}]},
            OPENAI_RESPONSES: {"model": "m", "input": "REEF-FAIL-STREAM"}}[client]
    r = requests.post(p.url + PATH[client], json={**body, "stream": True}, headers=H, timeout=30)
    name, last = raw_events(r)[-1]
    if client == ANTHROPIC:
        assert name == "error" and last["error"]["message"] == "scripted stream failure"
    elif client == OPENAI_CHAT:
        assert last["error"]["message"] == "scripted stream failure"
    else:
        assert name == "response.failed" and last["response"]["error"]["message"] == "scripted stream failure"
    rec = p.gateway.get_record("relay", last["reef"]["agent_record_id"])
    assert rec["status"] == "error" and "scripted stream failure" in rec["error"]


def test_token_counting_has_no_translation(serve, provider):
    p = start(serve, provider, OPENAI_CHAT)
    r = requests.post(p.url + "/v1/messages/count_tokens", headers=H, timeout=30, json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and "openai.chat" in r.json()["error"]["message"]


def test_a_request_that_cannot_be_translated_is_a_400_naming_it(serve, provider):
    p = start(serve, provider, ANTHROPIC)
    r = requests.post(p.url + "/v1/responses", headers=H, timeout=30, json={
        "model": "m", "input": "hi", "previous_response_id": "resp_1"})
    assert r.status_code == 400 and "previous_response_id" in r.json()["error"]["message"]
    assert provider.requests == []


def test_both_workers_translate_and_record(tmp_path, provider):
    """scripts/serve.py with two workers: the primary and a relay worker (server/workers.py) both translate."""
    from pathlib import Path

    from reef_lab.records.store import read_log
    from reef_lab.testing import free_port
    from reef_lab.testing.agents import ReefServer

    def logs_with_records() -> int:  # each worker writes its own record log
        return sum(1 for f in (Path(tmp_path) / "data" / "records").glob("log-*.bin") if read_log(f)[0])

    n = 0
    with ReefServer(provider.url, tmp_path / "data", free_port(), dialect="openai-chat", workers=2) as srv:
        # A new connection each: either worker may take it, but which one does is the kernel's choice, and on a
        # busy machine one worker can take a long run of them: ask until both have recorded (at most 400 calls).
        while n < 400 and (n < 40 or logs_with_records() < 2):
            r = requests.post(srv.url + "/v1/messages", timeout=60, headers={
                **H, "x-claude-code-session-id": f"s{n}"}, json={
                "model": "m", "max_tokens": 50, "stream": n % 2 == 1, "messages": [{"role": "user", "content": TASK}],
                "tools": [{"name": "Write", "input_schema": {"type": "object", "properties": PROPS}}]})
            assert r.status_code == 200 and "tool_use" in r.text
            n += 1
        records = srv.records("relay")
        logs = logs_with_records()
    assert logs == 2, f"after {n} calls only {logs} worker(s) recorded"
    assert len(records) == n and all(r["metadata"]["upstream"]["dialect"] == OPENAI_CHAT for r in records)
    calls = provider.calls("/v1/chat/completions")
    assert [c["headers"]["x-claude-code-session-id"] for c in calls] == [f"s{i}" for i in range(n)]
