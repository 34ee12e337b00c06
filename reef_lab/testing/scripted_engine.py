"""An engine that generates by script, for agent tests that need a model which calls a given tool.

No small model writes a chosen tool call on an agent's prompt of thousands of tokens (and agents sample: Codex sends
no temperature), so this engine writes the answer a model would: the prompt's token ids come from the engines' own
`ChatTokenizer` (the shipped tool template renders the request's tools and history, as the embedded engine does),
and the answer is text in the model's own words, a `<tool_call>` JSON as reef_lab's parser reads it, streamed in
small deltas. Everything after the engine (reading the dialect, parsing calls, rendering and streaming them in the
client's item types, records, episodes) is reef_lab's real code. Stated shortcut: no forward pass; token ids are the
tokenizer's encoding of the scripted text, every logprob 0.

The script, for a task `REEF-TASK path=<abs path> content=<word>` in a user message (reef_lab/testing/scripted_provider.py
uses the same words):

- no tool result yet: write the file, with a freeform `apply_patch` tool when one is offered (a patch adding it),
  else with the shell tool (`printf`);
- one tool result: read the file back through the shell, upper-cased (`tr a-z A-Z < path`), so the words of the
  next answer can only come from that tool's output;
- two or more: a text answer quoting the last tool result's last line;
- no task: `ok`.

Every request is kept in `requests` (the ChatRequest, its messages as the model sees them).
"""

from __future__ import annotations

import json
import re
import shlex

from reef_lab.engines.base import ChatRequest, Generation, Generator
from reef_lab.engines.remote import ChatTokenizer

TASK = re.compile(r"REEF-TASK path=(/[A-Za-z0-9_./-]+) content=([A-Za-z0-9_-]+)")


def shell_arguments(tools: list[dict], script: str) -> tuple[str, dict] | None:
    """(function, arguments) that run `script` with the first shell-like tool: a `cmd` string (Codex's
    `exec_command`), a `command` list (`local_shell`, `shell`) or a `command` string (`shell_command`)."""
    for t in tools:
        fn = t["function"]
        props = (fn.get("parameters") or {}).get("properties") or {}
        if "cmd" in props:
            return fn["name"], {"cmd": script}
        if "command" in props:
            array = props["command"].get("type") == "array"
            return fn["name"], {"command": ["bash", "-lc", script] if array else script}
    return None


def script(request: ChatRequest) -> str:
    """The answer's text for `request` (the rules above)."""
    text = "\n".join(m["content"] for m in request.messages if m["role"] == "user" and isinstance(m["content"], str))
    task = TASK.search(text)
    if task is None:
        return "ok"
    path, content = task.groups()
    results = [m["content"] for m in request.messages if m["role"] == "tool"]
    tools = request.tool_use.tools if request.tool_use else []
    call = None
    if not results:
        patch = f"*** Begin Patch\n*** Add File: {path}\n+{content}\n*** End Patch\n"
        names = {t["function"]["name"] for t in tools}
        call = ("apply_patch", {"input": patch}) if "apply_patch" in names else \
            shell_arguments(tools, f"printf '%s\\n' {shlex.quote(content)} > {shlex.quote(path)}")
    elif len(results) == 1:
        call = shell_arguments(tools, f"tr a-z A-Z < {shlex.quote(path)}")
    if call is None:
        lines = [line for line in (results[-1] if results else "").splitlines() if line.strip()]
        return f"The file says {lines[-1] if lines else '(nothing)'}."
    name, args = call
    return "On it.\n<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


class ScriptedStream:
    def __init__(self, text: str, prompt_ids: list[int], token_ids: list[int]):
        self.release_id, self.prompt_ids = "base", prompt_ids
        self._text, self._ids = text, token_ids

    def __iter__(self):
        yield from (self._text[i:i + 7] for i in range(0, len(self._text), 7))

    def result(self, timeout: float | None = None) -> Generation:
        return Generation(self._text, self._ids, [0.0] * len(self._ids), self.prompt_ids, "stop", "base")

    def cancel(self) -> None:
        pass


class ScriptedEngine(Generator):
    """A Generator answering by `script`; `tokenizer` is a Hugging Face tokenizer (SmolLM2's in the tests)."""

    model_name = "scripted-model"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.chat = ChatTokenizer(tokenizer, tokenizer.eos_token_id)
        self.requests: list[ChatRequest] = []

    @classmethod
    def from_config(cls, cfg) -> ScriptedEngine:
        from reef_lab.engines.embedded import default_cache_dir
        from reef_lab.engines.tiny import smollm2_tokenizer

        cls.no_options("scripted", cfg.engine_settings())
        return cls(smollm2_tokenizer(default_cache_dir()))

    @property
    def release_id(self) -> str:
        return "base"

    def release_for(self, scenario: str | None) -> str:
        return "base"

    def submit(self, request: ChatRequest) -> ScriptedStream:
        prompt_ids = self.chat.request_ids(request)
        self.requests.append(request)
        text = script(request)
        ids = self.chat.completion_ids(text)
        return ScriptedStream(text, prompt_ids, ids)

    def count_tokens(self, messages: list[dict]) -> int:
        return len(self.chat.prompt_ids(messages))

    def info(self) -> dict:
        return {"engine": "scripted", "model_name": self.model_name}

    def close(self) -> None:
        pass
