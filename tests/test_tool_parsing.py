"""Tool calls without a model: the one parser (streaming or not), the tool template, and the three dialects' tool
fields read into one form, with a 400 naming the field for each malformed one."""

from __future__ import annotations

import copy
import random

import pytest

from reef_lab.engines.base import Generation
from reef_lab.engines.remote import ChatTokenizer
from reef_lab.engines.tools import SHIPPED_TEMPLATE, ParsedCall, ToolCallParser, ToolUse, parse_turn
from reef_lab.errors import BadRequest
from reef_lab.wire import dialects
from tests.tool_model import PREFILL, WEATHER, call

TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
USE = ToolUse([WEATHER, TIME])


def shape(parts):
    return [p if isinstance(p, str) else (p.name, p.arguments) for p in parts]


# ---- the parser ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, parts, errors", [
    ("Just text.", ["Just text."], 0),
    (call("Paris"), [("get_weather", {"city": "Paris"})], 0),
    ("Checking.\n" + call("Paris") + "\n" + call("Rome") + "\n",
     ["Checking.", ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})], 0),
    (call("Paris") + "\n\nDone.  ", [("get_weather", {"city": "Paris"}), "Done.  "], 0),
    ('<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call>', [("get_time", {})], 0),  # string arguments
    ('<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>',
     ['<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>'], 1),  # bad JSON
    ('A <tool_call>{"name": "launch", "arguments": {}}</tool_call>',
     ['A <tool_call>{"name": "launch", "arguments": {}}</tool_call>'], 1),  # unknown function
    ('<tool_call>{"name": "get_time"}</tool_call>', ['<tool_call>{"name": "get_time"}</tool_call>'], 1),
    ('<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>',
     ['<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>'], 1),
    ('<tool_call>["get_time"]</tool_call>', ['<tool_call>["get_time"]</tool_call>'], 1),
    ('x <tool_call>{"name": "get_time", "arguments": {}}', ['x <tool_call>{"name": "get_time", "arguments": {}}'], 1),
    ("a <tool_c", ["a <tool_c"], 0),  # a tag that never completes is text
    ("<tool_call>", ["<tool_call>"], 1),
])
def test_parse_turn(text, parts, errors):
    turn = parse_turn(USE, text)
    assert shape(turn.parts) == parts
    assert len(turn.errors) == errors
    assert all(e["error"] and e["text"].startswith("<tool_call>") for e in turn.errors)


def test_unknown_function_error_says_why():
    turn = parse_turn(USE, '<tool_call>{"name": "launch", "arguments": {}}</tool_call>')
    assert turn.errors == [{"text": '<tool_call>{"name": "launch", "arguments": {}}</tool_call>',
                            "error": "unknown function 'launch'"}]


def test_streamed_parse_equals_whole_parse_at_every_split():
    """Fed in random pieces (down to one character), the parser emits what parsing the whole text gives."""
    texts = ["Checking.\n" + call("Paris") + "\n" + call("Rome") + " and <b>bold</b> <tool", call("Oslo") + " after",
             "x <tool_call>{bad}</tool_call> y " + call("Rome"), "  lead " + call("A") + "   ", "<<tool_call>"
             + '{"name": "get_time", "arguments": {}}</tool_call>>']
    rng = random.Random(0)
    for text in texts:
        whole = parse_turn(USE, text)
        for _ in range(30):
            parser, got, i = ToolCallParser(USE), [], 0
            while i < len(text):
                j = i + rng.randint(1, 7)
                got += parser.feed(text[i:j])
                i = j
            got += parser.close()
            merged = []
            for p in got:
                if isinstance(p, str) and merged and isinstance(merged[-1], str):
                    merged[-1] += p
                else:
                    merged.append(p)
            assert shape(merged) == shape(whole.parts), text
            assert parser.errors == whole.errors


def test_text_is_held_back_only_while_it_may_open_a_call():
    parser = ToolCallParser(USE)
    assert parser.feed("Hello <tool") == ["Hello"]  # " <tool" might start a call
    assert parser.feed("box> ok ") == [" <toolbox> ok"]  # it did not; trailing space waits for what follows
    assert parser.feed(call("Paris")) == [ParsedCall(0, "get_weather", {"city": "Paris"}, call("Paris"))]
    assert parser.feed("\n") == [] and parser.close() == []


def test_no_tools_or_choice_none_passes_text_through():
    for use in (None, ToolUse([WEATHER], "none")):
        assert shape(parse_turn(use, call("Paris") + " ").parts) == [call("Paris") + " "]
        assert ToolCallParser(use).feed("a <tool") == ["a <tool"]


def test_parallel_off_keeps_the_first_call():
    turn = parse_turn(ToolUse([WEATHER], parallel=False), call("Paris") + call("Rome"))
    assert shape(turn.parts) == [("get_weather", {"city": "Paris"})]
    assert [(c.name, c.arguments) for c in turn.dropped] == [("get_weather", {"city": "Rome"})]


def test_tool_choice_prefills():
    assert ToolUse([WEATHER], "required").prefill() == "<tool_call>\n"
    assert ToolUse([WEATHER], "function", "get_weather").prefill() == PREFILL
    assert ToolUse([WEATHER]).prefill() == ToolUse([WEATHER], "none").prefill() == ""
    with pytest.raises(ValueError, match="not among the tools"):
        ToolUse([WEATHER], "function", "nope")


# ---- the template -------------------------------------------------------------------------------------------------
def test_requests_without_tools_keep_the_models_own_prompt(tokenizer):
    chat = ChatTokenizer(tokenizer, tokenizer.eos_token_id)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    own = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert chat.prompt_ids(msgs) == list(own["input_ids"])
    assert chat.prompt_ids(msgs, None, "") == list(own["input_ids"])


def test_tools_history_and_prefill_in_the_shipped_template(tokenizer):
    chat = ChatTokenizer(tokenizer, tokenizer.eos_token_id)
    assert chat.tool_template_origin == str(SHIPPED_TEMPLATE)  # SmolLM2's own template renders no tools
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
            {"role": "tool", "tool_call_id": "a", "name": "get_weather", "content": "sunny"},
            {"role": "tool", "tool_call_id": "b", "name": "get_weather", "content": "rain"}]
    text = tokenizer.decode(chat.prompt_ids(msgs, [WEATHER], PREFILL))
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '\n{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city"' in text
    assert ("<|im_start|>assistant\n" + call("Paris") + "\n" + call("Rome") + "<|im_end|>\n") in text
    assert ("<|im_start|>tool\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\n" + PREFILL) in text
    assert text.endswith("<|im_start|>assistant\n" + PREFILL)
    no_tools = tokenizer.decode(chat.prompt_ids(msgs))  # tool turns alone (tool_choice none) still render
    assert "# Tools" not in no_tools and "<tool_response>\nsunny" in no_tools


def test_tool_template_choice(tokenizer, tmp_path):
    own = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if tools %}T{{ tools | length }}{% endif %}"
    tok = copy.deepcopy(tokenizer)  # the session's tokenizer keeps its own template (from_pretrained(name_or_path)
    # failed on a fresh machine, where the tokenizer came from the GGUF and that folder holds no tokenizer files)
    tok.chat_template = own
    assert ChatTokenizer(tok, 2).tool_template_origin == "model"  # a template that renders tools is the model's
    assert tok.decode(ChatTokenizer(tok, 2).prompt_ids([{"role": "user", "content": "x"}], [WEATHER])) == "[user]xT1"
    path = tmp_path / "mine.jinja"
    path.write_text("{% for m in messages %}<{{ m.content }}>{% endfor %}{{ raise_exception('no') if tools|length > 1 }}")
    mine = ChatTokenizer(tok, 2, str(path))
    assert mine.tool_template_origin == str(path)
    with pytest.raises(ValueError, match="the chat template refused the conversation"):
        mine.prompt_ids([{"role": "user", "content": "x"}], [WEATHER, TIME])
    with pytest.raises(ValueError, match="does not render tools"):
        ChatTokenizer(tokenizer, 2, "model")
    with pytest.raises(ValueError, match="is not a file"):
        ChatTokenizer(tokenizer, 2, str(tmp_path / "missing.jinja"))
    from reef_lab.config import ServeConfig  # the --tool-template flag: checked at start
    assert ServeConfig(tool_template=str(path)).tool_template == str(path)
    with pytest.raises(ValueError, match="tool_template must be auto, model or a Jinja template file"):
        ServeConfig(tool_template=str(tmp_path / "missing.jinja"))


# ---- the dialects' requests ---------------------------------------------------------------------------------------
PARAMS = WEATHER["function"]["parameters"]
CHAT = {"model": "m", "tools": [WEATHER], "messages": [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]}]}
RESPONSES = {"model": "m", "tools": [{"type": "function", "name": "get_weather",
                                      "description": "Current weather in a city", "parameters": PARAMS}],
             "input": [{"role": "user", "content": "Weather in Paris?"},
                       {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                        "arguments": '{"city": "Paris"}'},
                       {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]}
ANTHROPIC = {"model": "m", "max_tokens": 9, "tools": [{"name": "get_weather", "description": "Current weather in a city",
                                                       "input_schema": PARAMS}],
             "messages": [{"role": "user", "content": "Weather in Paris?"},
                          {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                             "input": {"city": "Paris"}}]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                        "content": [{"type": "text", "text": "sunny"}]}]}]}


def test_three_dialects_read_one_conversation_alike():
    reqs = [dialects.PARSERS[d](b) for d, b in ((dialects.OPENAI_CHAT, CHAT), (dialects.OPENAI_RESPONSES, RESPONSES),
                                                (dialects.ANTHROPIC, ANTHROPIC))]
    for r in reqs:
        assert r.tool_use.tools == [WEATHER] and r.tool_use.choice == "auto" and r.tool_use.parallel
        ids = [m.get("tool_call_id") or (m.get("tool_calls") or [{}])[0].get("id") for m in r.messages]
        strip = [{k: v for k, v in m.items() if k not in ("id", "tool_call_id")} for m in r.messages]
        for m in strip:
            for tc in m.get("tool_calls", []):
                tc.pop("id")
        assert strip == [{"role": "user", "content": "Weather in Paris?"},
                         {"role": "assistant", "content": "", "tool_calls": [
                             {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                         {"role": "tool", "name": "get_weather", "content": "sunny"}]
        assert ids[1] == ids[2]


def test_choices_and_parallel():
    chat = lambda **kw: dialects.parse_openai_chat({**CHAT, **kw}).tool_use  # noqa: E731
    assert chat(tool_choice="required").choice == "required"
    assert chat(tool_choice={"type": "function", "function": {"name": "get_weather"}}).function == "get_weather"
    assert chat(parallel_tool_calls=False).parallel is False
    resp = lambda **kw: dialects.parse_openai_responses({**RESPONSES, **kw}).tool_use  # noqa: E731
    assert resp(tool_choice={"type": "function", "name": "get_weather"}).function == "get_weather"
    an = lambda tc: dialects.parse_anthropic({**ANTHROPIC, "tool_choice": tc}).tool_use  # noqa: E731
    assert an({"type": "any"}).choice == "required" and an({"type": "none"}).choice == "none"
    assert an({"type": "tool", "name": "get_weather"}).prefill() == PREFILL
    assert an({"type": "auto", "disable_parallel_tool_use": True}).parallel is False
    assert dialects.parse_openai_chat({**CHAT, "tools": []}).tool_use is None
    # a Responses assistant message followed by its calls is one assistant turn
    two = dialects.parse_openai_responses({**RESPONSES, "input": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "output_text", "text": "Let me"}]},
        {"type": "function_call", "call_id": "a", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "get_weather", "arguments": ""}]})
    assert [(m["role"], m["content"], len(m.get("tool_calls", []))) for m in two.messages] == [
        ("user", "x", 0), ("assistant", "Let me", 2)]


def test_generation_and_the_relay_read_through_one_reader():
    """One reader per dialect (translate/): generation's strict reading and the relay's agree on the conversation's
    turns, and differ only where an engine here cannot serve what a relay target can carry (docs/architecture.md)."""
    from reef_lab.wire.translate import Translation
    two = {**RESPONSES, "input": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "one"},
                                  {"role": "assistant", "content": "two"}]}
    assert [(m["role"], m["content"]) for m in dialects.parse_openai_responses(two).messages] == [
        ("user", "x"), ("assistant", "one"), ("assistant", "two")]
    relayed = Translation(dialects.OPENAI_RESPONSES, dialects.OPENAI_CHAT, two).body["messages"]
    assert [(m["role"], m["content"]) for m in relayed] == [("user", "x"), ("assistant", "one"), ("assistant", "two")]
    # server-side state: refused by both, with the same words
    for read in (dialects.parse_openai_responses,
                 lambda b: Translation(dialects.OPENAI_RESPONSES, dialects.OPENAI_CHAT, b)):
        with pytest.raises(BadRequest, match="'previous_response_id'"):
            read({**RESPONSES, "previous_response_id": "resp_1"})
    # an image: carried by the relay, a 400 naming the part for the engine's text-only model
    image = {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}
    assert Translation(dialects.OPENAI_CHAT, dialects.ANTHROPIC, image).body["messages"][0]["content"][0]["type"] == "image"
    with pytest.raises(BadRequest, match=r"messages\[0\]: content part of type 'image_url' is not supported"):
        dialects.parse_openai_chat(image)
    # the seed reaches the engine; a Responses local_shell call reaches it as the function the model was offered
    shell = {**RESPONSES, "seed": 5, "tools": [{"type": "local_shell"}], "input": [
        {"role": "user", "content": "ls"}, {"type": "local_shell_call", "call_id": "s", "action": {
            "type": "exec", "command": ["ls"]}}, {"type": "local_shell_call_output", "call_id": "s", "output": "a.txt"}]}
    req = dialects.parse_openai_responses(shell)
    assert req.params.seed == 5 and req.tool_use.wire == {"local_shell": {"type": "local_shell"}}
    assert req.messages[1]["tool_calls"][0]["function"] == {"name": "local_shell", "arguments": {"command": ["ls"]}}
    assert req.messages[2] == {"role": "tool", "tool_call_id": "s", "name": "local_shell", "content": "a.txt"}
    assert "input[1] (local_shell_call)" in Translation(dialects.OPENAI_RESPONSES, dialects.OPENAI_CHAT, shell).dropped


@pytest.mark.parametrize("dialect, change, message", [
    ("chat", {"tools": {"name": "x"}}, "'tools' must be a list"),
    ("chat", {"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters must be a JSON Schema object"),
    ("chat", {"tools": [{"type": "web_search"}]}, "tools[0].type must be 'function'"),
    ("chat", {"tools": [WEATHER, WEATHER]}, "more than once"),
    ("chat", {"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'tool_choice' names function 'nope'"),
    ("chat", {"tool_choice": "always"}, "'tool_choice' must be"),
    ("chat", {"tool_choice": {"type": "function", "function": "get_weather"}}, "'tool_choice' must be"),
    ("chat", {"tools": None, "tool_choice": "required"}, "no 'tools'"),
    ("chat", {"parallel_tool_calls": "yes"}, "'parallel_tool_calls' must be a boolean"),
    ("chat", {"messages": CHAT["messages"][:1] + [{"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
     "messages[1].tool_call_id 'call_9' answers no tool call"),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "get_weather", "arguments": "{city"}}]}]}, "messages[0].tool_calls[0].function.arguments must be"),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": "{}"}}]}]}, "messages[0].tool_calls[0].id"),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": {"id": "c"}}]}, "messages[0].tool_calls must be a list"),
    ("responses", {"tools": [{"type": "function", "parameters": PARAMS}]}, "tools[0].name"),
    ("responses", {"tools": [{"type": "custom", "description": "no name"}]}, "tools[0].name"),
    ("responses", {"tools": [{"type": "namespace", "name": "ns"}]}, "tools[0]: a namespace tool needs"),
    ("responses", {"tool_choice": {"type": "web_search_preview"}}, "forces a 'web_search_preview' tool"),
    ("responses", {"input": [{"type": "local_shell_call", "call_id": "a", "action": {"command": "ls"}}]},
     "input[0].action must be"),
    ("responses", {"input": [{"type": "function_call_output", "call_id": "zz", "output": "x"}]},
     "input[0].call_id 'zz' answers no tool call"),
    ("responses", {"input": [{"type": "function_call", "call_id": "a", "name": "f", "arguments": "[1]"}]},
     "input[0].arguments must be a JSON object"),
    ("responses", {"input": [{"type": "reasoning", "summary": []}]}, "an item of type 'reasoning' is not"),
    ("anthropic", {"tools": [{"name": "get_weather"}]}, "tools[0].input_schema must be a JSON Schema object"),
    ("anthropic", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "is a server tool"),
    ("anthropic", {"tool_choice": {"type": "tool", "name": "nope"}}, "'tool_choice' names function 'nope'"),
    ("anthropic", {"tool_choice": "auto"}, "'tool_choice' must be"),
    ("anthropic", {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x",
                                                              "content": "r"}]}]},
     "messages[0].content[0].tool_use_id 'x' answers no tool call"),
    ("anthropic", {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                                   "input": "{}"}]}]},
     "messages[0].content[0].input must be an object"),
    ("anthropic", {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                              "input": {}}]}]}, "belongs in an assistant message"),
])
def test_malformed_tool_fields_are_400_naming_the_field(dialect, change, message):
    base = {"chat": CHAT, "responses": RESPONSES, "anthropic": ANTHROPIC}[dialect]
    parse = {"chat": dialects.parse_openai_chat, "responses": dialects.parse_openai_responses,
             "anthropic": dialects.parse_anthropic}[dialect]
    body = {k: v for k, v in {**base, **change}.items() if v is not None}
    with pytest.raises(BadRequest) as e:
        parse(body)
    assert message in e.value.message


# ---- answers ------------------------------------------------------------------------------------------------------
def gen(text, finish="stop"):
    return Generation(text=text, token_ids=[1] * 3, logprobs=[-0.1] * 3, prompt_token_ids=[1] * 5,
                      finish_reason=finish, release_id="base")


def test_rendered_calls_and_record_metadata_share_ids():
    text = "Checking.\n" + call("Paris") + "\n" + call("Rome") + "\nDone."
    for d in (dialects.OPENAI_CHAT, dialects.OPENAI_RESPONSES, dialects.ANTHROPIC):
        rid = dialects.new_response_id(d)
        resp = dialects.render(d, gen(text, "length"), "m", rid, 0, USE)
        meta = dialects.tool_record(d, gen(text), rid, USE)
        ids = [c["id"] for c in meta["tool_calls"]]
        assert len(set(ids)) == 2 and [c["arguments"] for c in meta["tool_calls"]] == [{"city": "Paris"}, {"city": "Rome"}]
        if d == dialects.OPENAI_CHAT:
            msg = resp["choices"][0]
            assert msg["finish_reason"] == "tool_calls" and msg["message"]["content"] == "Checking.\nDone."
            assert [c["id"] for c in msg["message"]["tool_calls"]] == ids and ids[0].startswith("call_")
            assert msg["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
        elif d == dialects.OPENAI_RESPONSES:
            assert [o["type"] for o in resp["output"]] == ["message", "function_call", "function_call", "message"]
            assert [o["call_id"] for o in resp["output"][1:3]] == ids and resp["status"] == "completed"
            assert len({o["id"] for o in resp["output"]}) == 4
        else:
            assert [b["type"] for b in resp["content"]] == ["text", "tool_use", "tool_use", "text"]
            assert [b["id"] for b in resp["content"][1:3]] == ids and ids[0].startswith("toolu_")
            assert resp["stop_reason"] == "tool_use"


def test_answers_without_calls_render_as_before():
    for use in (None, USE, ToolUse([WEATHER], "none")):
        chat = dialects.render(dialects.OPENAI_CHAT, gen("hi"), "m", "chatcmpl-" + "0" * 32, 0, use)
        assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hi", "refusal": None}
        an = dialects.render(dialects.ANTHROPIC, gen(""), "m", "msg_" + "0" * 32, 0, use)
        assert an["content"] == [{"type": "text", "text": ""}] and an["stop_reason"] == "end_turn"
        empty = dialects.render(dialects.OPENAI_CHAT, gen(""), "m", "chatcmpl-" + "0" * 32, 0, use)
        assert empty["choices"][0]["message"]["content"] == ""  # as OpenAI: null only beside calls
        resp = dialects.render(dialects.OPENAI_RESPONSES, gen("x", "length"), "m", "resp_" + "0" * 32, 0, use)
        assert resp["status"] == "incomplete" and [o["type"] for o in resp["output"]] == ["message"]
    assert dialects.tool_record(dialects.OPENAI_CHAT, gen("hi"), "chatcmpl-x", None) is None
    bad = dialects.tool_record(dialects.OPENAI_CHAT, gen('{"city": 1}\n</tool_call>'), "chatcmpl-" + "0" * 32,
                               ToolUse([WEATHER], "function", "get_weather"))
    assert bad["tool_calls"] == [] and bad["prefill"] == PREFILL and "not JSON" in bad["tool_call_errors"][0]["error"]


@pytest.mark.parametrize("dialect", [dialects.OPENAI_CHAT, dialects.ANTHROPIC])
def test_stream_rebuilds_the_rendered_answer(dialect):
    """The relay's stream accumulator, fed this stream, rebuilds what render gives (same ids, text, calls)."""
    import orjson

    from reef_lab.wire.accumulate import StreamAccumulator
    text = "Checking.\n" + call("Paris") + "\n" + call("Rome") + "\nDone."
    rid = dialects.new_response_id(dialect)
    g = gen(text)
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    acc = StreamAccumulator(dialect)
    for event in dialects.stream(dialect, iter(pieces), lambda: (g, "rec_1"), "m", rid, 0, 5, USE):
        data = event.split(b"data: ", 1)[1].strip()
        if data != b"[DONE]":
            acc.add(orjson.loads(data))
    final = dialects.render(dialect, g, "m", rid, 0, USE)
    got = acc.result()
    if dialect == dialects.OPENAI_CHAT:
        assert got["choices"][0]["message"]["content"] == final["choices"][0]["message"]["content"]
        assert got["choices"][0]["message"]["tool_calls"] == final["choices"][0]["message"]["tool_calls"]
        assert got["choices"][0]["finish_reason"] == "tool_calls"
    else:
        assert got["content"] == final["content"] and got["stop_reason"] == "tool_use"
