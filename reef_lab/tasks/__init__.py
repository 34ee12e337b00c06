"""Tasks: items with a verifier, what a candidate is scored on and what experiments draw prompts from.

- `base`: the Task protocol, TaskConfig and make_task, and the text tasks (arithmetic, colors, jsonl, choice);
- `tools`: tool tasks judged on whole episodes (ToolTask, the calculator agent, the tool loop);
- `bfcl`: BFCL v4's function-calling items and its AST check;
- `demos`: demonstration episodes of the calculator, as records the SFT recipe imports.
Tasks import no learner: learning/ and the experiments use them, not the other way round (tests/test_layout.py).
"""


def __getattr__(name: str):
    """reef_lab.tasks was a module until issue 19: its names resolve from reef_lab.tasks.base, with a
    DeprecationWarning, until 0.3.0 (reef_lab/_moved.py)."""
    from reef_lab._moved import old_name

    return old_name(__name__, name)
