#!/bin/bash
# The default suite with two busy loops beside it (issue 29: "the whole default suite passing while stress-like load runs").
cd "$(dirname "$0")/../.."
# each loop asks the kernel to SIGKILL it when this script dies (PR_SET_PDEATHSIG), kill -9 included
LOOP='import ctypes, signal; ctypes.CDLL(None).prctl(1, signal.SIGKILL)
while True: pass'
python3 -c "$LOOP" & B1=$!
python3 -c "$LOOP" & B2=$!
trap 'kill $B1 $B2 2>/dev/null' EXIT
start=$(date +%s)
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
timeout 3000 .venv/bin/python -m pytest -q -p no:cacheprovider --tb=short --show-capture=no
rc=$?
echo "rc=$rc wall=$(( $(date +%s) - start )) s end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
