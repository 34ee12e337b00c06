"""Harness releases installed into coding agents (Claude Code, Codex CLI, opencode, pi) in their own file formats.

`layout.py` turns a harness tree into an agent's files and the config that binds the agent to reef_lab;
`script.py` renders the POSIX sh script `GET /reef/harness/install` answers; `cli.py` is the `reef-lab agent`
wrapper command. docs/harness.md says how to use them.
"""
