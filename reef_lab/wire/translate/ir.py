"""The neutral form every dialect is read into and written from (one reader and one writer per dialect, instead of
a converter for each of the six ordered pairs).

A request is a `Conversation`: system text, turns whose parts are text, images, thinking, tool calls and tool
results, the tools, and the sampling settings the three APIs share. An answer is an `Answer`; a stream is a
sequence of `Start`, `BlockStart`, `Delta`, `BlockStop`, `Finish` (or `Failure`) events, the shape of Anthropic's
own stream, which the other two dialects map onto block by block.

Two consumers read requests through the same readers: the relay's writers, and generation (reef_lab/wire/dialects.py
`engine_request`), which reads strictly (`parse_request(body, strict=True)`: text only, function tools, the engines'
limits; docs/architecture.md says what differs and why).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Text:
    text: str


@dataclass
class Image:
    url: str  # a data: URL (base64) or an http(s) URL


@dataclass
class Thinking:
    """Reasoning the model showed. `signature` is the provider's proof of it (Anthropic's thinking signature, or a
    Responses reasoning item's encrypted_content): replayed only to the provider family that made it."""

    text: str
    signature: str | None = None
    redacted: str | None = None  # Anthropic redacted_thinking data


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of the arguments; a custom (freeform) tool's raw input
    custom: bool = False
    local_shell: bool = False  # a Responses local_shell_call (read for an engine only: a relay drops them)


@dataclass
class ToolResult:
    call_id: str
    content: list  # of Text and Image
    is_error: bool = False


@dataclass
class Turn:
    role: str  # system (mid-conversation), user, assistant
    parts: list


@dataclass
class Tool:
    name: str
    description: str | None
    parameters: dict
    custom: bool = False  # a Responses freeform tool: its call carries one string
    strict: bool | None = None
    local_shell: bool = False  # Responses' local_shell, offered to an engine's model as a function


@dataclass
class Conversation:
    system: list[str]
    turns: list[Turn]
    model: str | None = None
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str | dict | None = None  # auto | none | required | {"name": ...}
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    stream: bool = False
    reasoning: str | None = None  # effort: minimal, low, medium, high (or what the client named)
    reasoning_budget: int | None = None  # Anthropic's thinking budget, when the client gave one
    user: str | None = None
    namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)  # flat tool name -> (namespace, name)
    dropped: list[str] = field(default_factory=list)  # what the target dialect cannot carry (kept in the record)


@dataclass
class Usage:
    input: int = 0  # all prompt tokens, cached ones included
    output: int = 0
    cached: int = 0
    cache_write: int = 0
    reasoning: int = 0


STOPS = ("end", "length", "tool_calls", "stop_sequence", "refusal", "pause")


@dataclass
class Answer:
    id: str
    model: str | None
    parts: list  # Text, Thinking, ToolCall
    stop: str = "end"  # one of STOPS
    stop_sequence: str | None = None
    usage: Usage = field(default_factory=Usage)
    created: int = 0


# ---- stream events ----------------------------------------------------------------------------------------------
@dataclass
class Start:
    id: str
    model: str | None
    usage: Usage | None = None


@dataclass
class BlockStart:
    index: int
    part: object  # Text(""), Thinking(""), ToolCall(id, name, "")


@dataclass
class Delta:
    index: int
    text: str = ""  # text, thinking or argument JSON, by the block's kind
    signature: str | None = None  # a thinking block's signature (sent whole, at its end)


@dataclass
class BlockStop:
    index: int


@dataclass
class Finish:
    stop: str
    stop_sequence: str | None = None
    usage: Usage | None = None


@dataclass
class Failure:
    message: str
    type: str = "api_error"


def effort_from_budget(budget: int) -> str:
    """Anthropic's thinking budget as an OpenAI reasoning effort (LiteLLM's thresholds)."""
    return "low" if budget < 2048 else "medium" if budget < 8192 else "high"


BUDGET_OF_EFFORT = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384, "xhigh": 32000, "max": 32000}
