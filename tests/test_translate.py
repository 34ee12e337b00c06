"""Dialect translation, request by request and event by event (reef_lab/wire/translate): the shapes each
provider documents, the fields each side cannot carry, and clear refusals."""

from __future__ import annotations

import orjson
import pytest

from reef_lab.errors import BadRequest
from reef_lab.wire import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from reef_lab.wire.translate import Translation, error_object

WRITE = {"name": "Write", "description": "write a file", "input_schema": {
    "type": "object", "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["file_path", "content"]}}
PNG = "iVBORw0KGgo="

# A Claude Code turn 2: system blocks with cache hints, an image, thinking with its signature, a tool call and its
# result, a mid-conversation system message, adaptive thinking with an effort.
CLAUDE_TURN_2 = {
    "model": "claude-x", "max_tokens": 64000, "stream": True,
    "system": [{"type": "text", "text": "You are Claude Code."},
               {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "write it"},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": PNG}}]},
        {"role": "system", "content": "Available agents: ..."},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should write.", "signature": "sig-1"},
            {"type": "text", "text": "Writing."},
            {"type": "tool_use", "id": "toolu_1", "name": "Write", "input": {"file_path": "/a", "content": "x"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "done",
                                      "cache_control": {"type": "ephemeral"}},
                                     {"type": "text", "text": "thanks"}]}],
    "tools": [WRITE, {"type": "web_search_20250305", "name": "web_search"}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
    "metadata": {"user_id": '{"device_id":"d"}'}, "context_management": {"edits": []},
}


def test_anthropic_request_becomes_chat():
    tr = Translation(ANTHROPIC, OPENAI_CHAT, CLAUDE_TURN_2)
    b = tr.body
    assert b["messages"][0] == {"role": "system", "content": "You are Claude Code.\n\nBe brief."}
    assert b["messages"][1] == {"role": "user", "content": [
        {"type": "text", "text": "write it"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}
    assert b["messages"][2] == {"role": "system", "content": "Available agents: ..."}
    assert b["messages"][3] == {"role": "assistant", "content": "Writing.", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "Write",
                                                            "arguments": '{"file_path":"/a","content":"x"}'}}]}
    # the tool result comes first, as its own message right after the call; the user's text follows
    assert b["messages"][4] == {"role": "tool", "tool_call_id": "toolu_1", "content": "done"}
    assert b["messages"][5] == {"role": "user", "content": "thanks"}
    assert b["tools"] == [{"type": "function", "function": {"name": "Write", "description": "write a file",
                                                            "parameters": WRITE["input_schema"]}}]
    assert b["parallel_tool_calls"] is False and b["tool_choice"] == "auto"
    assert b["max_tokens"] == 64000 and b["reasoning_effort"] == "high"
    assert b["stream"] is True and b["stream_options"] == {"include_usage": True}
    assert "user" not in b  # Claude Code's device id is meant for Anthropic only
    assert "tools[1] (web_search_20250305: an Anthropic-defined tool)" in tr.dropped


def test_anthropic_request_becomes_responses():
    b = Translation(ANTHROPIC, OPENAI_RESPONSES, CLAUDE_TURN_2).body
    assert b["instructions"] == "You are Claude Code.\n\nBe brief." and b["store"] is False
    kinds = [(i["type"], i.get("role")) for i in b["input"]]
    assert kinds == [("message", "user"), ("message", "system"), ("message", "assistant"), ("function_call", None),
                     ("function_call_output", None), ("message", "user")]
    assert b["input"][0]["content"][1] == {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}",
                                           "detail": "auto"}
    assert b["input"][3] == {"type": "function_call", "call_id": "toolu_1", "name": "Write",
                             "arguments": '{"file_path":"/a","content":"x"}'}
    assert b["input"][4] == {"type": "function_call_output", "call_id": "toolu_1", "output": "done"}
    assert b["tools"][0]["type"] == "function" and b["tools"][0]["strict"] is False
    assert b["reasoning"] == {"effort": "high"} and "max_output_tokens" in b


# A Codex turn 2: developer instructions as input items, a namespace tool, a hosted tool, a reasoning item carrying
# the provider's encrypted content, a freeform (custom) tool.
CODEX_TURN_2 = {
    "model": "gpt-x", "stream": True, "store": False, "include": ["reasoning.encrypted_content"],
    "instructions": "You are Codex.", "reasoning": {"effort": "medium", "summary": "auto"},
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: none."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "write it"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Plan."}],
         "encrypted_content": "sig-9"},
        {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": '{"cmd":"ls"}'},
        {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "ok"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"}],
    "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {
        "cmd": {"type": "string"}}}},
              {"type": "custom", "name": "apply_patch", "description": "patch files"},
              {"type": "namespace", "name": "agents", "description": "sub-agents", "tools": [
                  {"type": "function", "name": "spawn", "parameters": {"type": "object", "properties": {}}}]},
              {"type": "web_search"}],
    "tool_choice": "auto", "parallel_tool_calls": True, "prompt_cache_key": "k",
}


def test_responses_request_becomes_anthropic():
    tr = Translation(OPENAI_RESPONSES, ANTHROPIC, CODEX_TURN_2)
    b = tr.body
    assert b["system"] == "You are Codex.\n\nSandbox: none."
    assert b["thinking"] == {"type": "enabled", "budget_tokens": 8191} and b["max_tokens"] == 8192
    assert b["messages"][0] == {"role": "user", "content": [{"type": "text", "text": "write it"}]}
    # the reasoning item's encrypted content is the signature Anthropic gave: replayed with thinking on
    assert b["messages"][1] == {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Plan.", "signature": "sig-9"},
        {"type": "tool_use", "id": "call_1", "name": "exec_command", "input": {"cmd": "ls"}},
        {"type": "tool_use", "id": "call_2", "name": "apply_patch", "input": {"input": "*** Begin Patch"}}]}
    assert b["messages"][2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_1", "is_error": False, "content": "a.txt"},
        {"type": "tool_result", "tool_use_id": "call_2", "is_error": False, "content": "ok"}]}
    names = [t["name"] for t in b["tools"]]
    assert names == ["exec_command", "apply_patch", "agents__spawn"]
    assert b["tools"][1]["input_schema"]["properties"] == {"input": {"type": "string"}}
    assert "tools[3] (web_search: a tool the provider hosts)" in tr.dropped
    assert "input[7] (web_search_call)" in tr.dropped


def test_chat_request_becomes_anthropic_and_tool_messages_merge():
    body = {"model": "m", "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}},
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{\"a\":2}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "r2"}]}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": "required", "temperature": 1.5, "stop": "END", "max_completion_tokens": 50}
    b = Translation(OPENAI_CHAT, ANTHROPIC, body).body
    assert b["system"] == "sys" and b["max_tokens"] == 50 and b["stop_sequences"] == ["END"]
    assert b["temperature"] == 1.0  # Anthropic's range ends at 1
    assert b["tool_choice"] == {"type": "any"}
    assert b["messages"][2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "c1", "is_error": False, "content": "r1"},
        {"type": "tool_result", "tool_use_id": "c2", "is_error": False, "content": "r2"}]}


def test_thinking_is_left_off_when_the_last_tool_turn_has_no_signature():
    """A chat client cannot carry Anthropic's signature back; Anthropic refuses thinking on without it."""
    body = {"model": "m", "reasoning_effort": "high", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "reasoning_content": "hmm", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"}]}
    tr = Translation(OPENAI_CHAT, ANTHROPIC, body)
    assert "thinking" not in tr.body
    assert any(d.startswith("reasoning: the last assistant turn") for d in tr.dropped)
    assert tr.body["messages"][1]["content"] == [{"type": "tool_use", "id": "c1", "name": "f", "input": {}}]


@pytest.mark.parametrize("client,upstream,body,needle", [
    (OPENAI_RESPONSES, ANTHROPIC, {"model": "m", "input": "x", "previous_response_id": "resp_1"},
     "previous_response_id"),
    (OPENAI_RESPONSES, OPENAI_CHAT, {"model": "m", "input": [{"type": "item_reference", "id": "x"}]},
     "item_reference"),
    (ANTHROPIC, OPENAI_CHAT, {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "x"}}]}]},
     "document"),
    (ANTHROPIC, OPENAI_CHAT, {"model": "m", "max_tokens": 5, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]}]}]},
     "image in a tool result"),
    (OPENAI_CHAT, ANTHROPIC, {"model": "m", "n": 2, "messages": [{"role": "user", "content": "x"}]}, "'n'"),
    (OPENAI_CHAT, ANTHROPIC, {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {}}]}]}, "input_audio"),
    (OPENAI_CHAT, ANTHROPIC, {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}, "http(s) URL"),
    (ANTHROPIC, OPENAI_CHAT, {"model": "m", "max_tokens": 5, "messages": "hi"}, "'messages' must be a non-empty list"),
    (OPENAI_CHAT, ANTHROPIC, {"model": "m", "messages": [{"role": "user", "content": "x"}],
                              "tool_choice": "sometimes"}, "tool_choice"),
])
def test_what_cannot_be_translated_is_refused_by_name(client, upstream, body, needle):
    with pytest.raises(BadRequest) as e:
        Translation(client, upstream, body)
    assert needle in e.value.message


# ---- answers -----------------------------------------------------------------------------------------------------
CHAT_TOOL_ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "created": 5, "model": "qwen", "choices": [{
    "index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Writing.", "reasoning_content": "think",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "Write",
                                                                          "arguments": '{"file_path":"/a"}'}}]}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
              "prompt_tokens_details": {"cached_tokens": 6}}}


def test_chat_answer_becomes_anthropic_and_responses():
    a = Translation(ANTHROPIC, OPENAI_CHAT, {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "x"}]}).answer(CHAT_TOOL_ANSWER)
    assert a["content"] == [{"type": "thinking", "thinking": "think", "signature": ""},
                            {"type": "text", "text": "Writing."},
                            {"type": "tool_use", "id": "call_1", "name": "Write", "input": {"file_path": "/a"}}]
    assert a["stop_reason"] == "tool_use"
    assert a["usage"] == {"input_tokens": 4, "output_tokens": 4, "cache_read_input_tokens": 6,
                          "cache_creation_input_tokens": 0}
    r = Translation(OPENAI_RESPONSES, OPENAI_CHAT, {"model": "m", "input": "x"}).answer(CHAT_TOOL_ANSWER)
    assert [i["type"] for i in r["output"]] == ["reasoning", "message", "function_call"]
    assert r["output"][2]["call_id"] == "call_1" and r["output"][2]["arguments"] == '{"file_path":"/a"}'
    assert r["status"] == "completed" and r["usage"]["input_tokens"] == 10
    assert r["usage"]["input_tokens_details"] == {"cached_tokens": 6}


def test_anthropic_answer_becomes_chat_and_responses_with_custom_and_namespaced_calls():
    answer = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "stop_reason": "tool_use",
              "content": [{"type": "thinking", "thinking": "t", "signature": "sig"},
                          {"type": "tool_use", "id": "toolu_1", "name": "apply_patch", "input": {"input": "*** P"}},
                          {"type": "tool_use", "id": "toolu_2", "name": "agents__spawn", "input": {"n": 1}}],
              "usage": {"input_tokens": 3, "cache_read_input_tokens": 7, "output_tokens": 2}}
    r = Translation(OPENAI_RESPONSES, ANTHROPIC, CODEX_TURN_2).answer(answer)
    reasoning, custom, call = r["output"]
    assert reasoning["encrypted_content"] == "sig" and reasoning["summary"][0]["text"] == "t"
    assert custom["type"] == "custom_tool_call" and custom["input"] == "*** P" and custom["call_id"] == "toolu_1"
    assert call["type"] == "function_call" and call["namespace"] == "agents" and call["name"] == "spawn"
    assert r["usage"]["input_tokens"] == 10 and r["usage"]["input_tokens_details"]["cached_tokens"] == 7
    c = Translation(OPENAI_CHAT, ANTHROPIC, {"model": "m", "messages": [{"role": "user", "content": "x"}]}).answer(
        {**answer, "stop_reason": "max_tokens"})
    assert c["choices"][0]["finish_reason"] == "length"
    assert c["choices"][0]["message"]["reasoning_content"] == "t"
    assert [t["function"]["name"] for t in c["choices"][0]["message"]["tool_calls"]] == ["apply_patch",
                                                                                         "agents__spawn"]


def test_invalid_arguments_reach_an_anthropic_client_whole():
    bad = {**CHAT_TOOL_ANSWER, "choices": [{**CHAT_TOOL_ANSWER["choices"][0], "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "Write", "arguments": "{not json"}}]}}]}
    a = Translation(ANTHROPIC, OPENAI_CHAT, {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "x"}]}).answer(bad)
    assert a["content"] == [{"type": "tool_use", "id": "c", "name": "Write", "input": {"_raw_arguments": "{not json"}}]


def test_responses_answer_with_incomplete_status_is_max_tokens():
    resp = {"id": "resp_1", "object": "response", "status": "incomplete", "model": "m",
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": [{"type": "message", "id": "m", "role": "assistant", "status": "incomplete",
                        "content": [{"type": "output_text", "text": "par", "annotations": []}]}],
            "usage": {"input_tokens": 1, "output_tokens": 2}}
    a = Translation(ANTHROPIC, OPENAI_RESPONSES, {"model": "m", "max_tokens": 2, "messages": [
        {"role": "user", "content": "x"}]}).answer(resp)
    assert a["stop_reason"] == "max_tokens" and a["content"] == [{"type": "text", "text": "par"}]


def test_errors_take_the_clients_shape():
    body = orjson.dumps({"error": {"message": "model 'x' not found", "type": "invalid_request_error",
                                   "code": "model_not_found"}})
    assert error_object(ANTHROPIC, 404, body) == {"type": "error", "error": {
        "type": "not_found_error", "message": "upstream provider: model 'x' not found"}}
    vllm = orjson.dumps({"detail": "Not Found"})
    assert error_object(OPENAI_CHAT, 404, vllm)["error"]["message"] == "upstream provider: Not Found"
    ant = orjson.dumps({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
    assert error_object(OPENAI_RESPONSES, 429, ant)["error"] == {
        "message": "upstream provider: slow down", "type": "rate_limit_error", "param": None, "code": None}


# ---- streams -----------------------------------------------------------------------------------------------------
def sse_events(route_answer: list[bytes]) -> list[tuple[str | None, object]]:
    out = []
    for ev in route_answer:
        name, data = None, []
        for line in ev.decode().split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        text = "\n".join(data)
        out.append((name, "[DONE]" if text == "[DONE]" else orjson.loads(text)))
    return out


def run_stream(client, upstream, request, provider_events):
    st = Translation(client, upstream, request).stream()
    out = []
    for name, obj in provider_events:
        out += st.feed(name, obj)
    out += st.end()
    assert st.finished and st.failure is None
    return out + st.final()


def test_chat_stream_becomes_anthropic_events():
    from reef_lab.testing.scripted_provider import Plan, chat_answer

    req = {"model": "m", "stream": True, "reasoning_effort": "low", "stream_options": {"include_usage": True},
           "tools": [{"type": "function", "function": {"name": "Write", "parameters": {"type": "object",
                      "properties": {"file_path": {}, "content": {}}}}}],
           "messages": [{"role": "user", "content": "REEF-TASK path=/tmp/a content=x"}]}
    raw = orjson.dumps(req)
    events = sse_events(chat_answer(req, Plan("/v1/chat/completions", req, raw), True))
    out = run_stream(ANTHROPIC, OPENAI_CHAT, {"model": "m", "max_tokens": 9, "messages": [
        {"role": "user", "content": "x"}]}, events)
    names = [n for n, _ in out]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    starts = [o["content_block"] for n, o in out if n == "content_block_start"]
    assert [s["type"] for s in starts] == ["thinking", "text", "tool_use"]
    assert starts[2]["name"] == "Write" and starts[2]["input"] == {}
    args = "".join(o["delta"]["partial_json"] for n, o in out if n == "content_block_delta"
                   and o["delta"]["type"] == "input_json_delta")
    assert orjson.loads(args) == {"file_path": "/tmp/a", "content": "x"}
    # every block is closed before the message ends, in order
    assert [o["index"] for n, o in out if n == "content_block_stop"] == [0, 1, 2]
    delta = dict(out)["message_delta"]
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] == 12


def test_anthropic_stream_becomes_responses_events_and_the_signature_travels():
    from reef_lab.testing.scripted_provider import Plan, messages_answer

    req = {"model": "m", "max_tokens": 50, "stream": True, "thinking": {"type": "enabled", "budget_tokens": 2000},
           "tools": [{"name": "exec_command", "input_schema": {"type": "object", "properties": {"cmd": {}}}}],
           "messages": [{"role": "user", "content": "REEF-TASK path=/tmp/a content=x"}]}
    events = sse_events(messages_answer(req, Plan("/v1/messages", req, orjson.dumps(req)), True))
    out = run_stream(OPENAI_RESPONSES, ANTHROPIC, {"model": "m", "input": "x"}, events)
    kinds = [o["type"] for _, o in out]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    done = [o["item"] for _, o in out if o["type"] == "response.output_item.done"]
    assert [i["type"] for i in done] == ["reasoning", "message", "function_call"]
    assert done[0]["encrypted_content"].startswith("sig-msg_")
    assert done[2]["name"] == "exec_command" and orjson.loads(done[2]["arguments"])["cmd"].startswith("printf")
    final = out[-1][1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call"]
    assert [o["sequence_number"] for _, o in out] == list(range(len(out)))


def test_responses_stream_with_empty_completed_output_becomes_chat_chunks():
    from reef_lab.testing.scripted_provider import Plan, responses_answer

    req = {"model": "m", "stream": True, "tools": [{"type": "function", "name": "write_file", "parameters": {
        "type": "object", "properties": {"path": {}, "content": {}}}}], "input": "REEF-TASK path=/tmp/a content=x"}
    events = sse_events(responses_answer(req, Plan("/v1/responses", req, orjson.dumps(req)), True,
                                         completed_output=False))
    out = run_stream(OPENAI_CHAT, OPENAI_RESPONSES, {"model": "m", "messages": [{"role": "user", "content": "x"}]},
                     events)
    assert out[-1] == (None, "[DONE]")
    chunks = [o for _, o in out[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert text == "I will write the file."
    assert calls[0]["function"]["name"] == "write_file" and calls[0]["id"].startswith("call_")
    assert orjson.loads("".join(tc["function"]["arguments"] for tc in calls)) == {"path": "/tmp/a", "content": "x"}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] > 0


def test_a_provider_stream_failure_becomes_the_clients_error_event():
    st = Translation(ANTHROPIC, OPENAI_CHAT, {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "x"}]}).stream()
    out = st.feed(None, {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": "hi"}}]})
    out += st.feed(None, {"error": {"message": "overloaded", "type": "overloaded_error"}})
    assert st.failure is not None and not st.finished
    assert out[-1] == ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "overloaded"}})
