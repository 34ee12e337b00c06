"""The harness: a scenario's versioned text files that serving puts in front of the client's own instructions.

- `tree`: the harness tree (system prompt, rules, skills), its checks at release, how serving applies it;
- `change_requests`: a person asks for a change in plain words, a proposer model writes it (GEPA runs the worker);
- `install`: a release rendered into a coding agent's own files (Claude Code, Codex CLI, opencode, pi) and the
  `reef-lab agent` command that installs, runs, evolves and updates it.
"""


def __getattr__(name: str):
    """reef_lab.harness was a module until issue 40: its names resolve from reef_lab.harness.tree, with a
    DeprecationWarning, until 0.3.0 (reef_lab/_moved.py)."""
    from reef_lab._moved import old_name

    return old_name(__name__, name)
