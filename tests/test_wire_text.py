"""reef_lab.wire.text: a recorded call of any dialect read as text through the dialects' own readers (what the
records app, the GEPA learner and change requests show of a call)."""

from __future__ import annotations

import orjson
import pytest

from reef_lab.wire import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from reef_lab.wire import text

# The same conversation in each dialect: a system prompt, a question, a tool call, its result, a final question.
CHAT = {"model": "m", "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    {"role": "user", "content": "And tomorrow?"}]}
RESPONSES = {"model": "m", "instructions": "Be brief.", "input": [
    {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"},
    {"role": "user", "content": "And tomorrow?"}], "previous_response_id": None}
ANTHROPIC_REQ = {"model": "m", "max_tokens": 64, "system": "Be brief.", "messages": [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather",
                                       "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny, 21 C"}]},
    {"role": "user", "content": "And tomorrow?"}]}
REQUESTS = {OPENAI_CHAT: CHAT, OPENAI_RESPONSES: RESPONSES, ANTHROPIC: ANTHROPIC_REQ}

ANSWERS = {
    OPENAI_CHAT: {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_2", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Paris", "day": 1}'}}]}}]},
    OPENAI_RESPONSES: {"id": "r", "object": "response", "status": "completed", "output": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city":"Paris","day":1}'}]},
    ANTHROPIC: {"id": "a", "type": "message", "role": "assistant", "stop_reason": "tool_use", "content": [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"city": "Paris", "day": 1}}]},
}
LINES = [{"role": "system", "text": "Be brief.", "call": None},
         {"role": "user", "text": "Weather in Paris?", "call": None},
         {"role": "assistant", "text": "", "call": 'get_weather({"city":"Paris"})'},
         {"role": "tool", "text": "sunny, 21 C", "call": "call_1"},
         {"role": "user", "text": "And tomorrow?", "call": None}]


@pytest.mark.parametrize("dialect", list(REQUESTS))
def test_every_dialect_reads_as_the_same_lines_and_answer(dialect):
    req, resp = REQUESTS[dialect], ANSWERS[dialect]
    for given, sent in ((dialect, req), ("", req), (dialect, orjson.dumps(req).decode())):  # named, guessed, JSON text
        got = text.lines(given, sent)
        assert got == LINES, (given, got)
    assert text.request_messages(dialect, req) == [
        {"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": ""},
        {"role": "user", "content": "And tomorrow?"}]
    assert text.last_user_text(dialect, req) == "And tomorrow?"
    for given in (dialect, ""):
        assert text.response_text(given, resp) == "Checking."
        assert text.response_calls(given, resp) == ['get_weather({"city":"Paris","day":1})']


def test_a_request_the_reader_refuses_reads_as_one_line_that_says_why():
    got = text.lines(OPENAI_CHAT, {"messages": [{"role": "wizard", "content": "hi"}]})
    assert len(got) == 1 and "not readable as openai.chat" in got[0]["text"] and "messages[0].role" in got[0]["text"]
    assert "the recorded request is not a JSON object" in text.lines(OPENAI_CHAT, "not json")[0]["text"]
    assert text.request_messages(OPENAI_CHAT, {"messages": "x"}) == []


def test_no_answer_reads_as_nothing():
    for resp in (None, {}, {"error": {"message": "boom"}}, "raw text", {"choices": [], "id": "c"}):
        assert text.response_text(OPENAI_CHAT, resp) == "" and text.response_calls(OPENAI_CHAT, resp) == []
    assert text.response_text(ANTHROPIC, {"content": ["not a block"]}) == ""


def test_chat_message_is_the_gateways_chat_answer_without_nulls():
    rec = {"id": "rec_1", "dialect": OPENAI_CHAT, "response": ANSWERS[OPENAI_CHAT] | {
        "choices": [{"message": {"role": "assistant", "content": "4", "refusal": None}}]}}
    assert text.chat_message(rec) == {"role": "assistant", "content": "4"}
    with pytest.raises(ValueError, match="holds no answer"):
        text.chat_message({"id": "rec_2", "dialect": OPENAI_CHAT, "response": None, "status": "failed"})
    with pytest.raises(ValueError, match="reads OpenAI chat records"):
        text.chat_message({"id": "rec_3", "dialect": ANTHROPIC, "response": ANSWERS[ANTHROPIC]})
