"""Tool calls in the model's own words: which chat template lists the tools, and the one parser that reads calls back
out of generated text, for every engine that generates (embedded, vLLM, SGLang), so a record is the same whichever
engine served it.

The format is the Hermes / Qwen one many open models are trained on: tools listed in the system turn as JSON schemas,
a call written as `<tool_call>\\n{"name": "fn", "arguments": {...}}\\n</tool_call>` (several may follow one another),
a tool's result given back in a `tool` turn. The prompt is the model's own chat template when it renders `tools`,
else `templates/tool_call.jinja` (ChatML; SmolLM2 has no tool template), or the file the operator names
(`--tool-template`). docs/tools.md has the whole story: tool_choice, the parser's rules and its failure behaviour.

    parser = ToolCallParser(tool_use)          # per generation
    for delta in stream: emit(parser.feed(delta))   # text pieces and ToolCalls, in order
    emit(parser.close())
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
SHIPPED_TEMPLATE = Path(__file__).parent / "templates" / "tool_call.jinja"
CHOICES = ("auto", "none", "required", "function")


@dataclass
class ToolUse:
    """The tools a request offers and how the model must use them.

    `tools` are OpenAI function schemas `{"type": "function", "function": {"name", "description"?, "parameters"}}`
    (what transformers' `apply_chat_template(tools=...)` takes). `choice`: `auto` (the model decides), `none` (tools
    left out of the prompt, nothing parsed), `required` (the assistant turn is prefilled with `<tool_call>`), or
    `function` (prefilled up to the arguments of `function`). `parallel` False keeps only the first call.

    `wire`: the client's own form of the tools offered as functions that are not plain functions in its dialect
    (a Responses `custom` or `local_shell` tool, a namespaced function), by function name, so the answer names their
    calls as the client expects (reef_lab/wire/responses_tools.py). Engines do not read it."""

    tools: list[dict]
    choice: str = "auto"
    function: str | None = None
    parallel: bool = True
    wire: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.choice not in CHOICES:
            raise ValueError(f"tool choice must be one of {CHOICES}, got {self.choice!r}")
        if (self.choice == "function") != (self.function is not None):
            raise ValueError("a function is named exactly when the tool choice is 'function'")
        if self.function is not None and self.function not in self.names:
            raise ValueError(f"tool choice names {self.function!r}, which is not among the tools")

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    @property
    def parses(self) -> bool:
        """Whether generated text is read for calls (not with choice `none`, nor without tools)."""
        return bool(self.tools) and self.choice != "none"

    def prompt_tools(self) -> list[dict] | None:
        return self.tools if self.parses else None

    def prefill(self) -> str:
        """What the assistant turn starts with in the prompt: how `required` and a named function are enforced."""
        if self.choice == "required":
            return CALL_OPEN + "\n"
        if self.choice == "function":
            return CALL_OPEN + '\n{"name": ' + json.dumps(self.function, ensure_ascii=False) + ', "arguments": '
        return ""


def has_tool_turns(messages: list[dict]) -> bool:
    """Whether a conversation holds tool calls or tool results (which only a tool template renders)."""
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def template_uses_tools(source: str) -> bool:
    """Whether a chat template renders the `tools` it is given (its source names the variable)."""
    return re.search(r"\btools\b", source) is not None


def resolve_tool_template(own, setting: str | None) -> tuple[str, str]:
    """(template source, where it came from) for prompts with tools. `own` is the tokenizer's chat_template (a string,
    a mapping of named templates, or None); `setting` is `--tool-template`: None/`auto` (the model's own when it renders
    tools, else the shipped one), `model` (the model's own, which must render tools), or a Jinja file."""
    if isinstance(own, dict):
        own = own.get("tool_use") or own.get("default")
    if setting not in (None, "auto", "model"):
        path = Path(setting)
        if not path.is_file():
            raise ValueError(f"tool template {setting!r} is not a file (give a Jinja chat template, 'auto' or 'model')")
        return path.read_text(), str(path)
    if isinstance(own, str) and template_uses_tools(own):
        return own, "model"
    if setting == "model":
        raise ValueError("the model's own chat template does not render tools: leave --tool-template at auto (the "
                         f"shipped {SHIPPED_TEMPLATE.name}) or name a Jinja template file")
    return SHIPPED_TEMPLATE.read_text(), str(SHIPPED_TEMPLATE)


# ---- parsing generated text -----------------------------------------------------------------------------------
@dataclass
class ParsedCall:
    """One call the model made: `index` counts calls within the answer (the dialects derive call ids from it)."""

    index: int
    name: str
    arguments: dict
    raw: str  # the call as generated, tags included

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


def read_call(body: str, names: set[str]) -> tuple[str, dict]:
    """(name, arguments) of the JSON between the tags, or ValueError saying why it is not a call."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    name = obj.get("name")
    if not isinstance(name, str):
        raise ValueError("no string 'name'")
    if name not in names:
        raise ValueError(f"unknown function {name!r}")
    if "arguments" not in obj:
        raise ValueError("no 'arguments'")
    args = obj["arguments"]
    if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI's wire does
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            raise ValueError("'arguments' is a string that is not JSON") from None
    if not isinstance(args, dict):
        raise ValueError("'arguments' is not a JSON object")
    return name, args


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could be the start of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


@dataclass
class ToolCallParser:
    """Reads calls out of an assistant turn as it is generated. `feed` returns what can be emitted now: text pieces
    (str) and complete ToolCalls, in order. Text is emitted as it comes, except what might be the start of
    `<tool_call>` and trailing whitespace (dropped if a call follows); a call is emitted once its closing tag is in and
    it parses. Rules (the same streaming or not, since a whole text is parsed by feeding it at once):

    - text outside the tags is the answer's text; whitespace next to a call is dropped;
    - a `<tool_call>` whose JSON parses, names a known function and has object arguments becomes a call;
    - anything else (bad JSON, an unknown function, a missing field, no closing tag) stays text, as generated, and is
      listed in `errors`;
    - with `parallel` off, calls after the first are dropped from the answer and listed in `dropped`.

    A ToolUse that does not parse (none, or choice `none`) passes the text through untouched."""

    tool_use: ToolUse | None
    errors: list[dict] = field(default_factory=list)
    dropped: list[ParsedCall] = field(default_factory=list)
    calls: int = 0

    def __post_init__(self) -> None:
        self._on = self.tool_use is not None and self.tool_use.parses
        self._names = self.tool_use.names if self._on else set()
        self._buf, self._held, self._in_call, self._after_call = "", "", False, False
        self._found = 0  # calls read, dropped ones included

    def feed(self, delta: str) -> list:
        if not self._on:
            return [delta] if delta else []
        out: list = []
        self._buf += delta
        while True:
            if self._in_call:
                j = self._buf.find(CALL_CLOSE)
                if j < 0:
                    return out
                body, self._buf = self._buf[:j], self._buf[j + len(CALL_CLOSE):]
                self._in_call = False
                self._end_call(body, True, out)
                continue
            i = self._buf.find(CALL_OPEN)
            if i >= 0:
                self._text(self._buf[:i], out)
                self._buf, self._in_call = self._buf[i + len(CALL_OPEN):], True
                continue
            k = _partial_suffix(self._buf, CALL_OPEN)
            text, self._buf = self._buf[:len(self._buf) - k], self._buf[len(self._buf) - k:]
            self._text(text, out)
            return out

    def close(self) -> list:
        """The rest once generation ended: an unclosed call or a partial tag is text."""
        if not self._on:
            return []
        out: list = []
        if self._in_call:
            self._in_call = False
            self._end_call(self._buf, False, out)
        else:
            self._text(self._buf, out)
        self._buf = ""
        if self._held:
            out.append(self._held)
            self._held = ""
        return out

    def _text(self, text: str, out: list) -> None:
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        text = self._held + text
        kept = text.rstrip()
        self._held = text[len(kept):]
        if kept:
            out.append(kept)

    def _end_call(self, body: str, closed: bool, out: list) -> None:
        raw = CALL_OPEN + body + (CALL_CLOSE if closed else "")
        try:
            if not closed:
                raise ValueError(f"no closing {CALL_CLOSE}")
            name, args = read_call(body, self._names)
        except ValueError as e:
            self.errors.append({"text": raw, "error": str(e)})
            self._text(raw, out)
            return
        call = ParsedCall(self.calls, name, args, raw)
        self._found += 1
        self._held, self._after_call = "", True
        if self._found > 1 and not self.tool_use.parallel:
            self.dropped.append(call)
            return
        self.calls += 1
        out.append(call)


@dataclass
class ParsedTurn:
    """A whole parsed answer: `parts` are text segments and ToolCalls in order (adjacent text merged)."""

    parts: list
    errors: list[dict]
    dropped: list[ParsedCall]

    @property
    def calls(self) -> list[ParsedCall]:
        return [p for p in self.parts if isinstance(p, ParsedCall)]

    @property
    def texts(self) -> list[str]:
        return [p for p in self.parts if isinstance(p, str)]


def parse_turn(tool_use: ToolUse | None, text: str) -> ParsedTurn:
    """The answer `text` (the prefill, if the prompt had one, in front) as text segments and calls."""
    parser = ToolCallParser(tool_use)
    parts: list = []
    for p in parser.feed(text) + parser.close():
        if isinstance(p, str) and parts and isinstance(parts[-1], str):
            parts[-1] += p
        else:
            parts.append(p)
    return ParsedTurn(parts, parser.errors, parser.dropped)


def __getattr__(name: str):  # 0.1's class names, until 0.3.0 (reef_lab/_moved.py)
    from reef_lab._moved import renamed

    return renamed(__name__, name)
