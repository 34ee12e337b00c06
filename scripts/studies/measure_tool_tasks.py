"""What the base model does on the tool tasks: calculator episodes and BFCL v4 items through the embedded engine.

The embedded engine takes no `tools` yet, so the tools go in the prompt in the Hermes form and the replies are parsed
for `<tool_call>` blocks (reef_lab.tasks.tools.TextToolChat); answers are greedy. Writes
<out>.md and its JSON (every episode's transcript and verdict; results/data/ for a page in results/).

    .venv/bin/python scripts/studies/measure_tool_tasks.py --n 20 --out results/tool-tasks-base
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


from reef_lab.engines.base import ChatRequest, SamplingParams  # noqa: E402
from reef_lab.engines.embedded import EmbeddedEngine  # noqa: E402
from reef_lab.tasks.base import make_task  # noqa: E402
from reef_lab.tasks.tools import TextToolChat, evaluate_episodes  # noqa: E402
from scripts.command_line import command_line, data_file, data_link  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20, help="items per task")
    ap.add_argument("--seed", type=int, default=0, help="seed of the items")
    ap.add_argument("--max-tokens", type=int, default=128, help="max_tokens of each reply")
    ap.add_argument("--max-turns", type=int, default=4, help="model replies per calculator episode")
    ap.add_argument("--tasks", nargs="*", default=["bfcl", "calculator"], choices=["bfcl", "calculator"])
    ap.add_argument("--model-path", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--out", default="results/tool-tasks-base")
    ap.add_argument("--append", action="store_true", help="keep the other tasks already in <out>'s JSON")
    args = ap.parse_args()

    engine = EmbeddedEngine.from_path(args.model_path, max_batch=args.n)
    replies = []

    def generate(messages):
        text = engine.submit(ChatRequest(messages, SamplingParams(max_tokens=args.max_tokens,
                                                                  temperature=0.0))).result().text
        replies.append(text)
        return text

    chat = TextToolChat(generate)
    out = {"command": command_line(), "model": engine.model_name, "n": args.n, "seed": args.seed,
           "max_tokens": args.max_tokens, "max_turns": args.max_turns, "tasks": {}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if args.append and data_file(args.out).is_file():
        out["tasks"] = json.loads(data_file(args.out).read_text())["tasks"]
    try:
        for name in args.tasks:
            task = make_task({"name": name, **({"options": {"max_turns": args.max_turns}} if name == "calculator"
                                               else {})})
            started = time.perf_counter()
            result = evaluate_episodes(task, chat, task.items(args.n, args.seed), workers=args.n)
            result["wall_s"] = round(time.perf_counter() - started, 1)
            result["command"] = out["command"]
            out["tasks"][name] = result
            print(f"{name}: accuracy {result['accuracy']:.3f}, tool calls {result['tool_calls']} "
                  f"(valid {result['valid_call_fraction']}), episodes with calls {result['episodes_with_calls']}"
                  f"/{result['n']}, {result['wall_s']} s", flush=True)
            data_file(args.out).write_text(json.dumps(out, indent=1, default=str))  # each task as it ends
            Path(f"{args.out}.md").write_text(report(out, data_link(args.out)))
    finally:
        engine.close()


def report(out: dict, data: str = "data/tool-tasks-base.json") -> str:
    rows = []
    for name, r in out["tasks"].items():
        valid = "-" if r["valid_call_fraction"] is None else f"{r['valid_call_fraction']:.2f}"
        rows.append(f"| {name} | {r['n']} | {r['accuracy']:.2f} ({int(r['accuracy'] * r['n'])}/{r['n']}) | "
                    f"{r['episodes_with_calls']}/{r['n']} | {r['tool_calls']} | {valid} | {r['turns_mean']:.1f} | "
                    f"{r['wall_s']} |")
    examples = []
    for name, r in out["tasks"].items():
        for ep in r["episodes"][:2]:
            first = next((m for m in ep["transcript"] if m.get("role") == "assistant"), {})
            text = first.get("raw_text") or first.get("content") or ""
            examples.append(f"- {name} `{ep['id']}` (score {ep['score']:g}): {ep['feedback']}\n  first reply: "
                            f"`{' '.join(text.split())[:200]}`")
    return f"""# Tool tasks: the base model (SmolLM2-135M-Instruct), before any training

Greedy, max_tokens {out['max_tokens']} per reply, at most {out['max_turns']} replies per calculator episode, items of
seed {out['seed']}; the tools in the system prompt in the Hermes form and the replies parsed for `<tool_call>`
blocks (the embedded engine takes no `tools` yet). Every transcript and verdict: [{data}]({data}).
Commands (on 2 shared CPU cores, hence the wall times):

{chr(10).join(sorted({f"    {r.get('command', out['command'])}" for r in out['tasks'].values()}))}

| task | items | success | episodes with a tool call | tool calls | valid share | replies per episode | wall s |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

- calculator: 6-9 digit `a + b`, `a * b`, `(a + b) * c` with `add` and `mul` tools; success = every call valid, a tool
  used, and the final reply's last number exact.
- bfcl: BFCL v4 simple_python, multiple, parallel and parallel_multiple items; success = the reply's calls pass
  BFCL's AST check (one reply, no execution).

First episodes:

{chr(10).join(examples)}
"""


if __name__ == "__main__":
    main()
