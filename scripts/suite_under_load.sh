#!/bin/bash
# The default suite with two busy loops beside it (issue 29: "the whole default suite passing while stress-like load runs").
cd "$(dirname "$0")/.."
python3 -c "while True: pass" & B1=$!
python3 -c "while True: pass" & B2=$!
trap 'kill $B1 $B2 2>/dev/null' EXIT
start=$(date +%s)
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
timeout 3000 .venv/bin/python -m pytest -q -p no:cacheprovider --tb=short --show-capture=no
rc=$?
echo "rc=$rc wall=$(( $(date +%s) - start )) s end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
