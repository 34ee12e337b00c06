"""Demonstrations of tool-task episodes, as `train` records that SFT learns from exactly as the engine serves.

Why. A model that never writes `<tool_call>` blocks gets no reward to learn from, so tool learning starts with
supervised demonstrations: the right calls, their results and the final answer. Written programmatically for the
calculator (`calculator_episode`: one `add`/`mul` call per operation, then the number alone), they become one record
per assistant turn (`turn_records`): the prompt is the whole history before that turn with the tools, templated by
the engine's own `ChatTokenizer` (the tool template, reef_lab/engines/tools.py) from the request the OpenAI SDK would
send (read by the gateway's own parser), and the completion is that turn as the template renders it in a history,
ending with the end-of-turn token. So a trained prompt is token for token the prompt the model is served, and a
trained completion is what the parser reads back as the same call.

One record per turn is the per-turn form of an episode sample: the same tokens trained with the same loss (each
turn's own tokens, given its history), one sample each. Records carry `prompt_token_ids` and `token_ids`, which the
learner uses as they are (POST /reef/records/batch takes both); `request` ({messages, tools}) and `response`
({content, tool_calls}) say what they are in the OpenAI chat shape.
"""

from __future__ import annotations

import json

from reef_lab.engines.remote import ChatTokenizer
from reef_lab.wire import OPENAI_CHAT
from reef_lab.wire.dialects import parse_openai_chat


def calculator_episode(item: dict) -> list[dict]:
    """The correct episode of a calculator item (CalculatorTask): OpenAI chat messages after the item's own."""
    expr = item["expression"]
    if expr.startswith("("):  # (a + b) * c
        ab, c = expr[1:].split(") * ")
        a, b = ab.split(" + ")
        steps = [("add", int(a), int(b)), ("mul", int(a) + int(b), int(c))]
    elif " + " in expr and " * " in expr:  # a * b + c
        ab, c = expr.split(" + ")
        a, b = ab.split(" * ")
        steps = [("mul", int(a), int(b)), ("add", int(a) * int(b), int(c))]
    elif " + " in expr:
        a, b = expr.split(" + ")
        steps = [("add", int(a), int(b))]
    else:
        a, b = expr.split(" * ")
        steps = [("mul", int(a), int(b))]
    out = []
    for i, (name, x, y) in enumerate(steps):
        call_id = f"call_{item['id']}_{i}"
        out.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps({"a": x, "b": y})}}]})
        out.append({"role": "tool", "tool_call_id": call_id, "content": str(x + y if name == "add" else x * y)})
    if out[-1]["content"] != item["answer"]:
        raise ValueError(f"calculator demo of {item['id']}: computed {out[-1]['content']}, expected {item['answer']}")
    out.append({"role": "assistant", "content": item["answer"]})
    return out


def _template_text(chat: ChatTokenizer, messages: list[dict], tools: list[dict], generation_prompt: bool) -> str:
    with chat._lock:  # noqa: SLF001 - the tokenizer's one lock (see ChatTokenizer)
        return chat.tokenizer.apply_chat_template(messages, tools=tools, chat_template=chat.tool_template,
                                                  add_generation_prompt=generation_prompt, tokenize=False)


def turn_records(chat: ChatTokenizer, item: dict, transcript: list[dict], scenario: str,
                 tags: dict[str, str] | None = None) -> list[dict]:
    """One `train` record per assistant turn of an episode (the item's messages, then `transcript`), for
    POST /reef/records/batch: prompt and completion token ids as the engine templates and parses them."""
    messages, tools = list(item["messages"]), item["tools"]
    out = []
    for k, turn in enumerate(transcript):
        if turn["role"] != "assistant":
            continue
        history = messages + transcript[:k]
        request = parse_openai_chat({"messages": history, "tools": tools})
        served = parse_openai_chat({"messages": history + [turn], "tools": tools})
        prompt_ids = chat.request_ids(request)
        prompt_text = _template_text(chat, request.messages, tools, True)
        full_text = _template_text(chat, served.messages, tools, False)
        if not full_text.startswith(prompt_text):
            raise ValueError(f"the tool template renders turn {k} of {item['id']} other than its generation prompt")
        completion = full_text[len(prompt_text):]
        end = chat.tokenizer.decode([chat.eos_id]) if chat.eos_id is not None else ""
        completion = completion.rstrip("\n").removesuffix(end)
        response = {"content": turn.get("content"), **({"tool_calls": turn["tool_calls"]} if turn.get("tool_calls")
                                                       else {})}
        out.append({"scenario": scenario, "kind": "train", "dialect": OPENAI_CHAT,
                    "request": {"messages": history, "tools": tools}, "response": response,
                    "prompt_token_ids": prompt_ids, "token_ids": chat.completion_ids(completion),
                    "tags": {"item": item["id"], "turn": str(k), **(tags or {})},
                    "metadata": {"completion_text": completion}})
    return out
