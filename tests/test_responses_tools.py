"""The OpenAI Responses API's tools that are not plain functions, on the engines that generate
(reef_lab/wire/responses_tools.py), both ways against the documented wire format: what a client sends is typed by
the official `openai` SDK's request types (checked with pydantic), and what reef_lab answers, whole or streamed, is
read by the SDK's own response models. Custom (freeform), local shell and namespaced tools are offered to the model as
functions and its calls go back as `custom_tool_call`, `local_shell_call` and namespaced `function_call` items; hosted
tools (web search, file search, ...) are left out of the prompt and listed in the record. The real Codex CLI on this
path: tests/test_codex_engine.py (marker agents).
"""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.responses import (Response, ResponseCustomToolCall, ResponseFunctionToolCall,
                                    ResponseInputItemParam, ResponseOutputMessage, ResponseStreamEvent, ToolParam)
from openai.types.responses.response_output_item import LocalShellCall
from pydantic import TypeAdapter

from reef_lab.engines.base import Generation
from reef_lab.engines.remote import ChatTokenizer
from reef_lab.testing.agents import records_of
from reef_lab.testing.scripted_engine import ScriptedEngine
from reef_lab.wire import dialects, responses_tools

GRAMMAR = {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/ "*** End Patch"'}
TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Current weather in a city", "strict": False,
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.", "format": GRAMMAR},
    {"type": "local_shell"},
    {"type": "namespace", "name": "docs", "description": "The docs server's tools.", "tools": [
        {"type": "function", "name": "search", "strict": False,
         "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
        {"type": "custom", "name": "note", "description": "Write a note."}]},
    {"type": "web_search"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
]
BODY = {"model": "m", "input": "Fix the bug.", "tools": TOOLS}
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"
CALLS = [("apply_patch", {"input": PATCH}),
         ("local_shell", {"command": ["bash", "-lc", "cat a.txt"], "working_directory": "/work", "timeout_ms": 5000}),
         ("docs__search", {"q": "patch format"}),
         ("docs__note", {"input": "remember this"}),
         ("get_weather", {"city": "Paris"})]
RID = "resp_" + "0" * 32


def written(calls) -> str:
    return "Let me do that.\n" + "\n".join(
        "<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>" for n, a in calls)


def sdk_response(obj: dict) -> Response:
    """The SDK's model of a Responses answer, read from `obj` (its usage left out: this SDK's model also wants
    `input_tokens_details.cache_write_tokens`, which is not what these tests are about)."""
    return Response.model_validate({**obj, "usage": None})


def gen(text: str) -> Generation:
    return Generation(text=text, token_ids=[1] * 3, logprobs=[-0.1] * 3, prompt_token_ids=[1] * 5,
                      finish_reason="stop", release_id="base")


def test_the_requests_are_in_the_documented_wire_format():
    tool = TypeAdapter(ToolParam)
    for t in TOOLS:
        tool.validate_python(t)


def test_tools_are_offered_as_functions_and_hosted_ones_dropped(tokenizer):
    req = dialects.parse_openai_responses(BODY)
    fns = {t["function"]["name"]: t["function"] for t in req.tool_use.tools}
    assert list(fns) == ["get_weather", "apply_patch", "local_shell", "docs__search", "docs__note"]
    patch_arg = fns["apply_patch"]["parameters"]
    assert patch_arg["required"] == ["input"] and patch_arg["properties"]["input"]["type"] == "string"
    assert GRAMMAR["definition"] in patch_arg["properties"]["input"]["description"]  # the model sees the grammar
    assert fns["local_shell"]["parameters"]["properties"]["command"]["type"] == "array"
    assert fns["local_shell"]["parameters"]["required"] == ["command"]
    assert fns["docs__search"]["parameters"] == TOOLS[3]["tools"][0]["parameters"]
    assert req.tool_use.wire == {"apply_patch": {"type": "custom", "name": "apply_patch"},
                                 "local_shell": {"type": "local_shell"},
                                 "docs__search": {"type": "function", "name": "search", "namespace": "docs"},
                                 "docs__note": {"type": "custom", "name": "note", "namespace": "docs"}}
    assert req.dropped == ["tools[4] (web_search: a hosted tool, which this engine cannot run)",
                           "tools[5] (file_search: a hosted tool, which this engine cannot run)"]
    prompt = tokenizer.decode(ChatTokenizer(tokenizer, tokenizer.eos_token_id).request_ids(req))
    assert '"name": "docs__note"' in prompt and "web_search" not in prompt and "file_search" not in prompt
    # a custom tool named by tool_choice is forced as its function; only hosted tools: nothing offered, all dropped
    forced = dialects.parse_openai_responses({**BODY, "tool_choice": {"type": "custom", "name": "apply_patch"}})
    assert (forced.tool_use.choice, forced.tool_use.function) == ("function", "apply_patch")
    hosted = dialects.parse_openai_responses({**BODY, "tools": TOOLS[4:]})
    assert hosted.tool_use is None and len(hosted.dropped) == 2


def test_calls_come_back_as_the_items_the_client_offered():
    use, conv = dialects.parse_openai_responses(BODY).tool_use, dialects.read_request(dialects.OPENAI_RESPONSES, BODY)
    obj = dialects.render(dialects.OPENAI_RESPONSES, gen(written(CALLS)), "m", RID, 0, use, conv)
    resp = sdk_response(obj)  # the SDK's own model of a Responses answer reads it
    kinds = [type(o) for o in resp.output]
    assert kinds == [ResponseOutputMessage, ResponseCustomToolCall, LocalShellCall, ResponseFunctionToolCall,
                     ResponseCustomToolCall, ResponseFunctionToolCall]
    patch, shell, search, note, weather = resp.output[1:]
    assert (patch.name, patch.input, patch.namespace) == ("apply_patch", PATCH, None)
    assert shell.action.model_dump() == {"type": "exec", "command": ["bash", "-lc", "cat a.txt"], "env": {},
                                         "timeout_ms": 5000, "working_directory": "/work", "user": None}
    assert (search.namespace, search.name, json.loads(search.arguments)) == ("docs", "search", {"q": "patch format"})
    assert (note.namespace, note.name, note.input) == ("docs", "note", "remember this")
    assert (weather.name, json.loads(weather.arguments)) == ("get_weather", {"city": "Paris"})
    assert len({o.call_id for o in resp.output[1:]}) == 5
    # the answer lists the tools in the client's own form (the hosted ones were never offered)
    assert [t.type for t in resp.tools] == ["function", "custom", "local_shell", "namespace"]
    # the record keeps each call as the model wrote it, with the id the client got
    meta = dialects.tool_record(dialects.OPENAI_RESPONSES, gen(written(CALLS)), RID, use)
    assert [(c["id"], c["name"], c["arguments"]) for c in meta["tool_calls"]] == [
        (o.call_id, n, a) for o, (n, a) in zip(resp.output[1:], CALLS)]


def sse_events(chunks) -> list[dict]:
    out = []
    for chunk in chunks:
        for line in chunk.decode().splitlines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
    return out


def test_the_stream_carries_each_item_as_the_api_streams_it():
    use, conv = dialects.parse_openai_responses(BODY).tool_use, dialects.read_request(dialects.OPENAI_RESPONSES, BODY)
    g = gen(written(CALLS))
    text = written(CALLS)
    raw = dialects.stream(dialects.OPENAI_RESPONSES, (text[i:i + 5] for i in range(0, len(text), 5)),
                          lambda: (g, "rec_1"), "m", RID, 0, 5, use, conv)
    events = sse_events(raw)
    adapter = TypeAdapter(ResponseStreamEvent)
    for e in events:  # every event is one the SDK knows, with the fields it needs
        if "response" in e:
            sdk_response(e["response"])
        adapter.validate_python({**e, "response": {**e["response"], "usage": None}} if "response" in e else e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    by_item: dict[int, list[str]] = {}
    for e in events:
        if "output_index" in e:
            by_item.setdefault(e["output_index"], []).append(e["type"])
    assert by_item[1][0] == "response.output_item.added" and by_item[1][-1] == "response.output_item.done"
    assert set(by_item[1][1:-1]) == {"response.custom_tool_call_input.delta", "response.custom_tool_call_input.done"}
    assert by_item[2] == ["response.output_item.added", "response.output_item.done"]  # a local shell call: whole
    assert "response.function_call_arguments.done" in by_item[3]
    added = next(e["item"] for e in events if e["type"] == "response.output_item.added" and e["output_index"] == 1)
    assert added["input"] == "" and added["status"] == "in_progress"
    delta = "".join(e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"
                    and e["output_index"] == 1)
    assert delta == PATCH
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    final = events[-1]
    assert final["type"] == "response.completed" and final["reef"]["agent_record_id"] == "rec_1"
    assert final["response"]["output"] == done == dialects.render(
        dialects.OPENAI_RESPONSES, g, "m", RID, 0, use, conv)["output"]


def test_the_items_sent_back_read_as_the_calls_the_model_wrote():
    """The next request holds the answer's items and their outputs (as Codex sends them): each call reads back into
    the function call the model wrote, so the next prompt shows it as generated, and each output answers it."""
    use, conv = dialects.parse_openai_responses(BODY).tool_use, dialects.read_request(dialects.OPENAI_RESPONSES, BODY)
    output = dialects.render(dialects.OPENAI_RESPONSES, gen(written(CALLS)), "m", RID, 0, use, conv)["output"]
    calls = output[1:]
    results = [{"type": "custom_tool_call_output", "call_id": calls[0]["call_id"], "output": "Success."},
               {"type": "local_shell_call_output", "id": calls[1]["call_id"], "output": "hi"},
               {"type": "function_call_output", "call_id": calls[2]["call_id"], "output": "found"},
               {"type": "custom_tool_call_output", "call_id": calls[3]["call_id"], "output": "noted"},
               {"type": "function_call_output", "call_id": calls[4]["call_id"], "output": "sunny"}]
    items = [{"type": "message", "role": "user", "content": "Fix the bug."}, *output, *results]
    adapter = TypeAdapter(ResponseInputItemParam)
    for item in items:
        adapter.validate_python(item)
    req = dialects.parse_openai_responses({**BODY, "input": items})
    user, assistant, *tool_msgs = req.messages
    assert assistant["content"] == "Let me do that."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in assistant["tool_calls"]] == CALLS
    assert [(m["name"], m["content"]) for m in tool_msgs] == [
        ("apply_patch", "Success."), ("local_shell", "hi"), ("docs__search", "found"), ("docs__note", "noted"),
        ("get_weather", "sunny")]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_sdk_gets_the_items_and_the_record_names_what_was_dropped(serve, tokenizer, stream):
    server = serve(ScriptedEngine(tokenizer))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0,
                           default_headers={"x-reef-scenario": "freeform"})
    kw = dict(model="scripted-model", input="REEF-TASK path=/tmp/a.txt content=hi", tools=[TOOLS[1], TOOLS[4]])
    if stream:
        with client.responses.stream(**kw) as s:
            for _ in s:
                pass
            resp = s.get_final_response()
    else:
        resp = client.responses.create(**kw)
    call = resp.output[-1]
    assert isinstance(call, ResponseCustomToolCall)
    assert call.input == "*** Begin Patch\n*** Add File: /tmp/a.txt\n+hi\n*** End Patch\n"
    [rec] = records_of(server.url, "freeform")
    assert rec["metadata"]["dropped"] == ["tools[1] (web_search: a hosted tool, which this engine cannot run)"]
    assert rec["metadata"]["tool_calls"] == [{"id": call.call_id, "name": "apply_patch",
                                              "arguments": {"input": call.input}}]
    assert rec["response"]["output"][-1]["type"] == "custom_tool_call"


def test_a_custom_call_with_other_arguments_reaches_the_client_as_their_json():
    """A model that writes a custom tool's call with other arguments than `input`: the client gets their JSON as the
    input (its own check reports it to the model), as a function gets whatever arguments were written."""
    assert responses_tools.custom_input({"input": "x"}) == "x"
    assert responses_tools.custom_input({"patch": "x"}) == '{"patch": "x"}'
    assert responses_tools.custom_input({"input": 3}) == '{"input": 3}'
