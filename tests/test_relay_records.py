"""A relayed stream's record keeps every streamed field (reef_lab/wire/accumulate.py): the thinking signature,
reasoning text, tool calls; a Responses record is built from the streamed items even when `response.completed`
arrives with `output: []`."""

from __future__ import annotations

import anthropic
import openai
import orjson

from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.testing.scripted_provider import ScriptedProvider
from reef_lab.wire.accumulate import StreamAccumulator
from reef_lab.wire import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES

H = {"x-reef-scenario": "rec"}
TASK = "REEF-TASK path=/tmp/reef-rec.txt content=abc"


def test_anthropic_thinking_signature_is_recorded(serve):
    with ScriptedProvider() as provider:
        p = serve(UpstreamEngine(provider.url, timeout=10))
        c = anthropic.Anthropic(base_url=p.url, api_key="k", default_headers=H)
        with c.messages.stream(model="m", max_tokens=3000, thinking={"type": "enabled", "budget_tokens": 2000},
                               messages=[{"role": "user", "content": TASK}],
                               tools=[{"name": "Write", "input_schema": {"type": "object", "properties": {
                                   "file_path": {}, "content": {}}}}]) as s:
            got = s.get_final_message()
        rec = p.gateway.list_records("rec")["records"][-1]
    thinking = rec["response"]["content"][0]
    assert thinking["type"] == "thinking" and thinking["signature"].startswith("sig-msg_")
    assert thinking["signature"] == got.content[0].signature  # what the client can replay
    assert thinking["thinking"] == "Thinking about the task."
    assert rec["response"]["content"][2]["input"] == {"file_path": "/tmp/reef-rec.txt", "content": "abc"}
    assert rec["response"]["stop_reason"] == "tool_use" and rec["response"]["usage"]["output_tokens"] == 12


def test_responses_record_is_built_from_the_streamed_items(serve):
    """The provider's response.completed says `output: []`; the tool call and the text came in the stream."""
    with ScriptedProvider(responses_completed_output=False) as provider:
        p = serve(UpstreamEngine(provider.url, timeout=10))
        c = openai.OpenAI(base_url=p.url + "/v1", api_key="k", default_headers=H)
        with c.responses.stream(model="m", input=TASK, reasoning={"effort": "low"}, tools=[
                {"type": "function", "name": "exec_command", "strict": False,
                 "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]) as s:
            for _ in s:
                pass
        rec = p.gateway.list_records("rec")["records"][-1]
    out = rec["response"]["output"]
    assert [i["type"] for i in out] == ["reasoning", "message", "function_call"]
    assert out[0]["summary"] == [{"type": "summary_text", "text": "Thinking about the task."}]
    assert out[1]["content"][0]["text"] == "I will write the file."
    assert out[2]["name"] == "exec_command" and "abc" in orjson.loads(out[2]["arguments"])["cmd"]
    assert rec["response"]["status"] == "completed" and rec["response"]["usage"]["output_tokens"] == 12


def test_chat_record_keeps_reasoning_and_tool_calls(serve):
    with ScriptedProvider() as provider:
        p = serve(UpstreamEngine(provider.url, timeout=10))
        c = openai.OpenAI(base_url=p.url + "/v1", api_key="k", default_headers=H)
        stream = c.chat.completions.create(model="m", stream=True, reasoning_effort="low", messages=[
            {"role": "user", "content": TASK}], tools=[{"type": "function", "function": {
                "name": "write_file", "parameters": {"type": "object", "properties": {"path": {}, "content": {}}}}}])
        chunks = list(stream)
        rec = p.gateway.list_records("rec")["records"][-1]
    msg = rec["response"]["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"] == "I will write the file."
    assert msg["reasoning_content"] == "Thinking about the task."
    assert msg["tool_calls"][0]["function"]["name"] == "write_file"
    assert orjson.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"path": "/tmp/reef-rec.txt",
                                                                           "content": "abc"}
    assert rec["response"]["id"] == chunks[0].id  # one id, not one per chunk joined together
    assert rec["response"]["choices"][0]["finish_reason"] == "tool_calls"


def test_unknown_and_later_fields_are_kept():
    a = StreamAccumulator(ANTHROPIC)
    for ev in [{"type": "message_start", "message": {"id": "m", "content": [], "usage": {"input_tokens": 3}}},
               {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
               {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Paris"}},
               {"type": "content_block_delta", "index": 0, "delta": {"type": "citations_delta", "citation": {
                   "type": "char_location", "cited_text": "Paris is"}}},
               {"type": "content_block_delta", "index": 0, "delta": {"type": "future_delta", "note": "a"}},
               {"type": "content_block_delta", "index": 0, "delta": {"type": "future_delta", "note": "b"}},
               {"type": "message_delta", "delta": {"stop_reason": "end_turn", "container": {"id": "c"}},
                "usage": {"output_tokens": 2}, "context_management": {"applied": []}}]:
        a.add(ev)
    r = a.result()
    assert r["content"] == [{"type": "text", "text": "Paris", "citations": [
        {"type": "char_location", "cited_text": "Paris is"}], "note": "ab"}]
    assert r["container"] == {"id": "c"} and r["context_management"] == {"applied": []}
    assert r["usage"] == {"input_tokens": 3, "output_tokens": 2}

    c = StreamAccumulator(OPENAI_CHAT)
    for ev in [{"id": "x", "model": "m", "system_fingerprint": "fp", "choices": [{"index": 0, "delta": {
                   "role": "assistant", "content": "a"}, "logprobs": {"content": [{"token": "a"}]}}]},
               {"id": "x", "model": "m", "choices": [{"index": 0, "delta": {"content": "b", "refusal": None},
                                                      "logprobs": {"content": [{"token": "b"}]}}]}]:
        c.add(ev)
    r = c.result()
    assert r["id"] == "x" and r["system_fingerprint"] == "fp"
    assert r["choices"][0]["message"]["content"] == "ab"
    assert r["choices"][0]["logprobs"] == {"content": [{"token": "a"}, {"token": "b"}]}

    s = StreamAccumulator(OPENAI_RESPONSES)  # completed fills in only what the items lack
    for ev in [{"type": "response.created", "response": {"id": "r", "status": "in_progress", "output": []}},
               {"type": "response.output_item.added", "output_index": 0, "item": {
                   "type": "function_call", "id": "fc", "call_id": "c", "name": "f", "arguments": ""}},
               {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{}"},
               {"type": "response.completed", "response": {"id": "r", "status": "completed", "usage": {
                   "output_tokens": 1}, "output": [{"type": "function_call", "id": "fc", "call_id": "c", "name": "f",
                                                    "arguments": "{}", "status": "completed"},
                                                   {"type": "message", "id": "m", "content": []}]}}]:
        s.add(ev)
    r = s.result()
    assert r["status"] == "completed" and r["usage"] == {"output_tokens": 1}
    assert r["output"][0] == {"type": "function_call", "id": "fc", "call_id": "c", "name": "f", "arguments": "{}",
                              "status": "completed"}
    assert r["output"][1]["type"] == "message"
