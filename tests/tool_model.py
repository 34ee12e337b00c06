"""A tiny Llama taught, in the test session, to answer a few fixed tool-calling prompts with fixed text.

The random tiny model never writes a tool call by itself, and the tool-call tests need real generations that the
engines' own code (prompt templating, decoding, parsing, rendering, streaming) turns into answers. So the model is
trained for a few dozen steps until greedy decoding reproduces each target exactly, with a margin: what it then
generates through the embedded engine (or SGLang's double) is a real generation of a real model. The prompts are
built by the engines' own ChatTokenizer with the shipped tool template, so the same conversation sent in any of the
three dialects reaches the same prompt and gets the same answer.
"""

from __future__ import annotations

import copy

import torch

from reef_lab.engines.remote import ChatTokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOLS = [WEATHER]
PREFILL = '<tool_call>\n{"name": "get_weather", "arguments": '


def call(city: str) -> str:
    return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>' % city


# A prompt where SmolLM2-135M (greedy) reliably writes a valid call (docs/tools.md: what it does)
COPY = "Reply with exactly this text and nothing else:\n" + call("Paris")


def result_turn(call_id: str = "c1") -> list[dict]:
    """The conversation after the Paris call was answered (ids are not in the prompt, so any id works)."""
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": call_id, "name": "get_weather", "content": "sunny, 21 C"}]


# (messages, prefill the prompt ends with, the answer the model learns)
SCRIPT = [
    ([{"role": "user", "content": "Weather in Paris?"}], "", call("Paris")),
    ([{"role": "user", "content": "Weather in Paris and Rome?"}], "", "Checking both.\n" + call("Paris") + "\n"
     + call("Rome")),
    ([{"role": "user", "content": "Broken call please"}], "",
     '<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>'),
    (result_turn(), "", "It is sunny in Paris."),
    ([{"role": "user", "content": "Weather in Oslo?"}], PREFILL, '{"city": "Oslo"}}\n</tool_call>'),
]


def train_tool_model(model, tokenizer, max_steps: int = 200, margin: float = 1.0):
    """A copy of `model` trained until greedy decoding gives every SCRIPT answer (each target token's logit beats
    every other by `margin`). The loss is a softmax over the targets and each position's current top tokens (the
    full vocabulary's backward pass is what makes this slow on a CPU); the stopping check uses the full vocabulary."""
    model = copy.deepcopy(model).train()
    chat = ChatTokenizer(tokenizer, tokenizer.eos_token_id)
    rows = [(chat.prompt_ids(m, TOOLS, prefill), chat.completion_ids(answer)) for m, prefill, answer in SCRIPT]
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), tokenizer.eos_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    where, targets = [], []
    for i, (p, c) in enumerate(rows):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        mask[i, :len(p) + len(c)] = 1
        where += [(i, len(p) - 1 + j) for j in range(len(c))]
        targets += c
    r, col = torch.tensor([w[0] for w in where]), torch.tensor([w[1] for w in where])
    targets = torch.tensor(targets)
    head = model.lm_head.weight
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(max_steps):
        h = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[r, col]
        with torch.no_grad():
            full = h @ head.T
            best_other = full.scatter(1, targets[:, None], float("-inf")).max(-1).values
            if bool((full.gather(1, targets[:, None])[:, 0] - best_other > margin).all()):
                return model.eval()
            cand = torch.unique(torch.cat([targets, full.topk(8, dim=-1).indices.flatten()]))
        index = torch.full((head.shape[0],), -1)
        index[cand] = torch.arange(len(cand))
        loss = torch.nn.functional.cross_entropy(h @ head[cand].T, index[targets])
        opt.zero_grad()
        loss.backward()
        opt.step()
    raise AssertionError(f"the tiny model did not learn the tool-call script in {max_steps} steps")
