"""Tool tasks: items whose success needs tool calls, the tool loop that runs them, and a verifier of whole episodes.

Why here. A tool task is judged on an *episode*: the model calls tools, gets their results, and answers. So a
`ToolTask` adds to the Task protocol the tools of each item (OpenAI function schemas, `item["tools"]`), their
execution (`execute`), the loop (`run_episode`) and `score_episode(item, transcript)`, where the transcript is the
episode's messages after the item's own, in OpenAI chat shape (assistant messages with `tool_calls`, `role: tool`
results, the final assistant answer). That shape is what every client holds after its own loop (the OpenAI or
Anthropic SDK, the Agents SDK), so one scorer serves:
- experiments: `run_episode(chat, item)` runs model -> tool call -> executed result -> model ... -> final answer
  (at most `max_turns` model replies) with any `ToolChat`, then the caller reports the episode's score;
- live reports: a client that ran its own loop scores its transcript with `score_episode` and reports that.
A `ToolChat` is `(messages, tools) -> assistant message`: `TextToolChat` wraps any text generator (the embedded
engine today) with a Hermes-style prompt (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) and a parser;
`OpenAIToolChat` calls an OpenAI-compatible server that takes `tools` itself.

`calculator` (CalculatorTask): large-number arithmetic (6-9 digit operands by default) that a small model gets right
only by calling `add`/`mul` and answering with the result. The held-out function-calling set is BFCL v4
(reef_lab/tasks/bfcl.py). Measured base-model scores: docs/tool-tasks.md.

There is one tool-call parser, the engines' (reef_lab/engines/tools.py): `TextToolChat` and `text_reply` read a
generated text with it, so a task run here and a reply served by an engine count the same calls.
"""

from __future__ import annotations

import json
import random
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Protocol

from reef_lab.engines.tools import ToolUse, parse_turn
from reef_lab.schema import check_fields
from reef_lab.tasks.base import Task, last_number, numbers_equal



class ToolChat(Protocol):
    def __call__(self, messages: list[dict], tools: list[dict]) -> dict:
        """The model's next assistant message (OpenAI chat shape: content, and tool_calls when it calls tools)."""


@dataclass
class Episode:
    transcript: list[dict]  # the messages after the item's own: assistant turns, tool results, the final answer
    turns: int  # model replies
    finished: bool  # the last reply called no tool (an answer), rather than running out of turns


@dataclass
class EpisodeScore:
    score: float
    correct: bool
    valid_calls: int
    invalid_calls: int
    feedback: str
    details: dict = field(default_factory=dict)

    def report(self, references: list[str], item_id: str | None = None) -> dict:
        """The body of POST /reef/report (or Gateway.report) on the episode's receipts: its score and feedback, the
        counts in metadata (a learner averages them per step: `report_correct`, `report_valid_call_fraction`, which
        an episode without a tool call leaves out)."""
        calls = self.valid_calls + self.invalid_calls
        meta = {"correct": self.correct, "valid_calls": self.valid_calls, "invalid_calls": self.invalid_calls,
                **({"valid_call_fraction": self.valid_calls / calls} if calls else {}),
                **({"item": item_id} if item_id else {})}
        return {"score": self.score, "feedback": self.feedback, "references": list(references), "metadata": meta}


# ---- tool calls: schemas, argument checks, the Hermes text form ---------------------------------------------------
def function_tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


_JSON_TYPES = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
               "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
               "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
               "array": lambda v: isinstance(v, list), "object": lambda v: isinstance(v, dict),
               "null": lambda v: v is None}


def schema_errors(schema: dict, value, where: str = "arguments") -> list[str]:
    """What is wrong with `value` under a JSON schema (the subset function schemas use: type, properties, required,
    additionalProperties, items, enum); [] when it fits."""
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types
    if types and not any(_JSON_TYPES.get(t, lambda v: True)(value) for t in types):
        return [f"{where} must be {' or '.join(types)}, got {type(value).__name__} {value!r}"[:200]]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where} must be one of {schema['enum']}, got {value!r}"[:200]]
    errors = []
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        errors += [f"{where} lacks required {k!r}" for k in schema.get("required") or [] if k not in value]
        for k, v in value.items():
            if k in props:
                errors += schema_errors(props[k], v, f"{where}.{k}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{where} has unknown {k!r}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            errors += schema_errors(schema["items"], v, f"{where}[{i}]")
    return errors


def call_arguments(call: dict) -> tuple[str, dict | None, str | None]:
    """(name, arguments, error) of an OpenAI tool call; arguments is None (and error says why) when they are not a
    JSON object."""
    fn = call.get("function") or {}
    name, raw = fn.get("name"), fn.get("arguments")
    if not isinstance(name, str) or not name:
        return "", None, "a tool call without a function name"
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as e:
        return name, None, f"{name}: arguments are not JSON ({e.msg})"
    if not isinstance(args, dict):
        return name, None, f"{name}: arguments must be a JSON object, got {type(args).__name__}"
    return name, args, None


def check_call(call: dict, tools: list[dict]) -> str | None:
    """Why a tool call is invalid for these tools (unknown name, arguments not a JSON object or not fitting the
    schema), or None when it is valid."""
    name, args, error = call_arguments(call)
    if error:
        return error
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    if name not in schemas:
        return f"unknown tool {name!r} (tools: {sorted(schemas)})"
    errors = schema_errors(schemas[name], args)
    return f"{name}: " + "; ".join(errors) if errors else None


def parse_tool_calls(text: str, tools: list[dict]) -> tuple[str, list[dict], list[str]]:
    """(content, tool calls in OpenAI shape, errors) of generated text in the Hermes form, read by the engines' own
    parser (reef_lab.engines.tools.parse_turn), so an episode run here is read as serving reads it: a
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block naming one of `tools` is a call; any other
    block (not JSON, an unknown function, no closing tag) stays in the content, as text, and is listed in errors."""
    turn = parse_turn(ToolUse(tools) if tools else None, text)
    calls = [{"id": f"call_{c.index}", "type": "function",
              "function": {"name": c.name, "arguments": c.arguments_json()}} for c in turn.calls]
    errors = [f"a <tool_call> block that is not a call ({e['error']}): {e['text'][:80]!r}" for e in turn.errors]
    return "".join(turn.texts).strip(), calls, errors


def hermes_tools_prompt(tools: list[dict]) -> str:
    """The tools block of a Hermes/Qwen2.5-style system prompt."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
            f"function signatures within <tools></tools> XML tags:\n<tools>\n{lines}\n</tools>\n\nFor each function "
            "call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def hermes_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """An OpenAI chat transcript with tools as plain chat messages for a template without tools: the tools block
    in the system message, calls as `<tool_call>` text, results as `<tool_response>` user turns."""
    out, system = [], hermes_tools_prompt(tools) if tools else ""
    for m in messages:
        if m["role"] == "system":
            system = f"{m.get('content') or ''}\n\n{system}".strip()
        elif m["role"] == "assistant":
            parts = [m.get("content") or ""] + [_hermes_call(c) for c in m.get("tool_calls") or []]
            out.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
        elif m["role"] == "tool":
            response = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1]["content"].startswith("<tool_response>"):
                out[-1]["content"] += "\n" + response  # parallel calls' results share one turn
            else:
                out.append({"role": "user", "content": response})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return ([{"role": "system", "content": system}] if system else []) + out


def _hermes_call(call: dict) -> str:
    _, args, _ = call_arguments(call)
    fn = call.get("function") or {}
    body = {"name": fn.get("name"), "arguments": args if args is not None else fn.get("arguments")}
    return "<tool_call>\n" + json.dumps(body, ensure_ascii=False) + "\n</tool_call>"


class TextToolChat:
    """A ToolChat over any text generator `generate(messages) -> str` (e.g. the embedded engine, which takes no
    `tools`): Hermes-style prompt in, parsed tool calls out."""

    def __init__(self, generate: Callable[[list[dict]], str]):
        self.generate = generate

    def __call__(self, messages: list[dict], tools: list[dict]) -> dict:
        text = self.generate(hermes_messages(messages, tools))
        content, calls, _ = parse_tool_calls(text, tools)
        reply = {"role": "assistant", "content": content or None, "raw_text": text}
        if calls:
            reply["tool_calls"] = calls
        return reply


class OpenAIToolChat:
    """A ToolChat over an OpenAI-compatible server that takes `tools` itself (an `openai.OpenAI` client)."""

    def __init__(self, client, model: str, **params):
        self.client, self.model, self.params = client, model, params

    def __call__(self, messages: list[dict], tools: list[dict]) -> dict:
        reply = self.client.chat.completions.create(model=self.model, messages=messages, tools=tools, **self.params)
        return reply.choices[0].message.model_dump(exclude_none=True)


# ---- the task protocol ---------------------------------------------------------------------------------------------
class ToolTask(Task):
    """A Task whose items carry `tools` and whose replies are judged as episodes."""

    max_turns: int = 8

    def execute(self, name: str, arguments: dict) -> str:
        """A tool's result as the text the model reads (an error text for a call it cannot run)."""
        raise NotImplementedError(f"{type(self).__name__} executes no tools")

    @abstractmethod
    def score_episode(self, item: dict, transcript: list[dict]) -> EpisodeScore: ...

    def run_episode(self, chat: ToolChat, item: dict, max_turns: int | None = None) -> Episode:
        """model -> tool calls -> executed results -> model ... until a reply calls no tool or max_turns replies
        (the last reply's calls are then not run: with max_turns 1, a task that executes no tools, BFCL, works)."""
        messages, transcript = list(item["messages"]), []
        turns, limit = 0, max_turns or self.max_turns
        while turns < limit:
            reply = chat(messages + transcript, item["tools"])
            turns += 1
            transcript.append(reply)
            if not reply.get("tool_calls"):
                return Episode(transcript, turns, True)
            if turns >= limit:
                break  # out of turns: calls that no reply could read the results of are not run
            for call in reply["tool_calls"]:
                error = check_call(call, item["tools"])
                name, args, _ = call_arguments(call)
                result = f"error: {error}" if error else self.execute(name, args)
                transcript.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result})
        return Episode(transcript, turns, False)

    def rollout(self, chat: ToolChat, item: dict) -> tuple[float, str]:
        """The item's whole episode (tool calls executed, their results read back), scored by score_episode; the
        text is the transcript in short (each call and its result, then the final reply)."""
        episode = self.run_episode(chat, item)
        return self.score_episode(item, episode.transcript).score, transcript_text(episode.transcript)

    def score(self, item: dict, text: str) -> float:
        """One reply as a one-message episode (its Hermes tool calls parsed)."""
        return self.score_episode(item, [text_reply(text, item["tools"])]).score

    def feedback(self, item: dict, text: str) -> str:
        return self.score_episode(item, [text_reply(text, item["tools"])]).feedback


def transcript_text(transcript: list[dict]) -> str:
    """An episode in one line: `add({"a": 1, "b": 2}) -> 3 | ... | final reply`."""
    parts = []
    for m in transcript:
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            parts.append(f"{fn.get('name')}({fn.get('arguments')})")
        if m.get("role") == "tool":
            parts[-1:] = [f"{parts[-1]} -> {m.get('content')}" if parts else f"-> {m.get('content')}"]
        elif m.get("role") == "assistant" and not m.get("tool_calls"):
            parts.append(m.get("content") or "")
    return " | ".join(parts)


def text_reply(text: str, tools: list[dict]) -> dict:
    content, calls, _ = parse_tool_calls(text, tools)
    return {"role": "assistant", "content": content or None, **({"tool_calls": calls} if calls else {})}


def tool_calls_of(transcript: list[dict], tools: list[dict]) -> tuple[int, list[str]]:
    """(valid call count, why each invalid one is) over an episode's assistant messages; a `<tool_call>` left in a
    reply's text (one no parser could read) counts as an invalid call."""
    valid, invalid = 0, []
    for m in transcript:
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            why = check_call(call, tools)
            valid, invalid = (valid + 1, invalid) if why is None else (valid, invalid + [why])
        invalid += ["a <tool_call> the parser could not read"] * (m.get("content") or "").count("<tool_call>")
    return valid, invalid


# ---- the calculator agent -------------------------------------------------------------------------------------------
CALCULATOR_TOOLS = [
    function_tool("add", "Add two integers and return a + b.", {
        "a": {"type": "integer", "description": "the first addend"},
        "b": {"type": "integer", "description": "the second addend"}}, ["a", "b"]),
    function_tool("mul", "Multiply two integers and return a * b.", {
        "a": {"type": "integer", "description": "the first factor"},
        "b": {"type": "integer", "description": "the second factor"}}, ["a", "b"]),
]
CALCULATOR_SYSTEM = ("You are a calculator agent. Do every addition and multiplication with the add and mul tools, "
                     "one call per operation, then reply with the final number only.")
# The same two operations under schemas a release trained on `add`/`mul` never saw (other names, argument names and
# descriptions; the call format is the same): what tool-use learning carries over to tools it was not trained on.
UNSEEN_CALCULATOR_TOOLS = [
    function_tool("sum_of", "Return the sum x + y of two whole numbers.", {
        "x": {"type": "integer", "description": "one number"},
        "y": {"type": "integer", "description": "the other number"}}, ["x", "y"]),
    function_tool("product_of", "Return the product x * y of two whole numbers.", {
        "x": {"type": "integer", "description": "one number"},
        "y": {"type": "integer", "description": "the other number"}}, ["x", "y"]),
]
UNSEEN_CALCULATOR_SYSTEM = ("You are a calculator agent. Do every sum and product with the sum_of and product_of "
                            "tools, one call per operation, then reply with the final number only.")
SCHEMAS = {"trained": (CALCULATOR_TOOLS, CALCULATOR_SYSTEM, ("add", "a", "b")),
           "unseen": (UNSEEN_CALCULATOR_TOOLS, UNSEEN_CALCULATOR_SYSTEM, ("sum_of", "x", "y"))}


@dataclass
class CalculatorOptions:
    min_digits: int = field(default=6, metadata={"help": "fewest digits per operand"})
    max_digits: int = field(default=9, metadata={"help": "most digits per operand"})
    forms: list[str] = field(default_factory=lambda: ["a + b", "a * b", "(a + b) * c"], metadata={
        "help": "question forms, drawn uniformly: 'a + b', 'a * b', '(a + b) * c' (two calls), 'a * b + c'"})
    require_tool_use: bool = field(default=True, metadata={
        "help": "an episode scores only if it called a tool (the answer came from the tools)"})
    max_turns: int = field(default=6, metadata={"client_max": 32, "help": "model replies per episode"})
    schema: str = field(default="trained", metadata={
        "help": "trained: the add/mul tools; unseen: the same operations as sum_of/product_of with arguments x, y "
                "(tools a release trained on add/mul never saw)"})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.schema not in SCHEMAS:
            raise ValueError(f"schema {self.schema!r}: the calculator's tool schemas are {sorted(SCHEMAS)}; pick one")
        if self.min_digits < 1:
            raise ValueError(f"min_digits = {self.min_digits}: an operand has at least 1 digit; set min_digits >= 1")
        if self.min_digits > self.max_digits:
            raise ValueError(f"min_digits = {self.min_digits}: more than max_digits = {self.max_digits}; set "
                             "min_digits <= max_digits")
        if self.max_digits > 18:
            raise ValueError(f"max_digits = {self.max_digits}: calculator operands have at most 18 digits; set "
                             "max_digits <= 18")
        if not self.forms:
            raise ValueError(f"forms []: give at least one of {sorted(FORMS)}")
        unknown = [f for f in self.forms if f not in FORMS]
        if unknown:
            raise ValueError(f"forms {self.forms}: {unknown[0]!r} is not a calculator form; use those of "
                             f"{sorted(FORMS)}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns = {self.max_turns}: an episode needs at least 1 model reply; set "
                             "max_turns >= 1")


FORMS = {"a + b": lambda a, b, c: a + b, "a * b": lambda a, b, c: a * b, "(a + b) * c": lambda a, b, c: (a + b) * c,
         "a * b + c": lambda a, b, c: a * b + c}


class CalculatorTask(ToolTask):
    """Large-number arithmetic through `add` and `mul` tools; an episode scores 1 when every tool call was valid,
    at least one was made (`require_tool_use`) and the final reply's last number is the exact result."""

    options_class = CalculatorOptions

    def __init__(self, config):
        super().__init__(config)
        self.options = CalculatorOptions(**config.options)
        self.max_turns = self.options.max_turns

    def items(self, n: int, seed: int) -> list[dict]:
        rng, o = random.Random(seed), self.options
        out = []
        for i in range(n):
            form = o.forms[rng.randrange(len(o.forms))]
            a, b, c = (rng.randrange(10 ** (d - 1), 10 ** d) for d in
                       (rng.randint(o.min_digits, o.max_digits) for _ in range(3)))
            question = form.replace("a", str(a)).replace("b", str(b)).replace("c", str(c))
            tools, system, _ = SCHEMAS[o.schema]
            out.append({"id": f"calc-{seed}-{i}", "tools": tools, "answer": str(FORMS[form](a, b, c)),
                        "expression": question, "messages": [
                            {"role": "system", "content": system},
                            {"role": "user", "content": f"What is {question}?"}]})
        return out

    def execute(self, name: str, arguments: dict) -> str:
        add, first, second = SCHEMAS[self.options.schema][2]
        a, b = arguments[first], arguments[second]
        return str(a + b if name == add else a * b)

    def score_episode(self, item: dict, transcript: list[dict]) -> EpisodeScore:
        valid, invalid = tool_calls_of(transcript, item["tools"])
        replies = [m for m in transcript if m.get("role") == "assistant"]
        final = replies[-1] if replies and not replies[-1].get("tool_calls") else None
        got = last_number(final.get("content") or "") if final else None
        correct = numbers_equal(got, item["answer"])
        used = valid + len(invalid) > 0
        ok = correct and not invalid and (used or not self.options.require_tool_use)
        if ok:
            why = f"Correct: {got} after {valid} valid tool call(s)."
        elif invalid:
            why = f"Invalid tool call(s): {'; '.join(invalid[:3])}."
        elif final is None:
            why = "No final answer: the episode ended on a tool call (out of turns)."
        elif not correct:
            why = f"Incorrect: the final answer is {got}, expected {item['answer']}."
        else:
            why = "The answer is right but no tool was called; this task asks for the tools."
        return EpisodeScore(1.0 if ok else 0.0, correct, valid, len(invalid), why,
                            {"answer": got, "used_tools": used, "finished": final is not None})


def evaluate_episodes(task: ToolTask, chat: ToolChat, items: list[dict], max_turns: int | None = None,
                      workers: int = 1) -> dict:
    """Run and score one episode per item: accuracy (mean score), the valid share of tool calls, how many episodes
    called a tool at all, and every episode's transcript and verdict."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item):
        ep = task.run_episode(chat, item, max_turns)
        return item, ep, task.score_episode(item, ep.transcript)

    with ThreadPoolExecutor(max(1, workers)) as pool:
        rows = list(pool.map(one, items))
    valid = sum(v.valid_calls for _, _, v in rows)
    calls = valid + sum(v.invalid_calls for _, _, v in rows)
    return {"n": len(rows), "accuracy": sum(v.score for _, _, v in rows) / max(1, len(rows)),
            "tool_calls": calls, "valid_call_fraction": valid / calls if calls else None,
            "episodes_with_calls": sum(1 for _, _, v in rows if v.valid_calls + v.invalid_calls),
            "turns_mean": sum(ep.turns for _, ep, _ in rows) / max(1, len(rows)),
            "episodes": [{"id": it["id"], "score": v.score, "correct": v.correct, "valid_calls": v.valid_calls,
                          "invalid_calls": v.invalid_calls, "feedback": v.feedback, "turns": ep.turns,
                          "transcript": ep.transcript} for it, ep, v in rows]}
