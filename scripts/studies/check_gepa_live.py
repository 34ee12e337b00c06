"""Live GEPA as a user runs it: `serve.py --recipe gepa` on the embedded model, traffic and reports with feedback
from `live_client.py --feedback`, until a new harness release serves; writes results/gepa-live.md.

    python scripts/studies/check_gepa_live.py [--rollouts 96] [--out runs/gepa-live]

Steps: start the server (fresh data dir, recipes/gepa/examples/live.yaml); GET /reef/harness (the seed, v1); run
the client (openai SDK; each answer scored by the task's verifier, reported with its feedback text and
metadata.answer); read the releases and the learner's state; GET /reef/harness again; send one more request and
check its x-reef-release-id and the record's release. The page says what it saw, including when no release came.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import requests

from reef_lab import procs
from reef_lab.testing import free_port
from reef_lab.testing.processes import start_child
from scripts.common import ROOT
from scripts.command_line import command_line

SCENARIO = "arithmetic-live"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", type=int, default=96)
    p.add_argument("--out", default=str(ROOT / "runs" / "gepa-live"), help="run folder (emptied first)")
    p.add_argument("--page", default=str(ROOT / "results" / "gepa-live.md"))
    args = p.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    h = {"x-reef-scenario": SCENARIO}
    serve_cmd = [sys.executable, "scripts/serve.py", "--port", str(port), "--data-dir", str(out / "data"),
                 "--recipe", "gepa", "--recipe-config", "recipes/gepa/examples/live.yaml"]
    client_cmd = [sys.executable, "scripts/live_client.py", "--url", base, "--scenario", SCENARIO, "--feedback",
                  "--temperature", "0", "--max-tokens", "48", "--rollouts", str(args.rollouts), "--concurrency", "3",
                  "--max-pool", "3", "--wait", "900"]
    started = time.time()
    server = start_child(serve_cmd, port, out / "serve.log", timeout=300)
    try:
        lines = ["# Live GEPA through the server", "", f"Command: `{command_line()}`, which runs", "", "```",
                 command_line(serve_cmd[1:]), command_line(client_cmd[1:]), "```", ""]
        first = requests.post(base + "/v1/chat/completions", headers=h, json={
            "model": "default", "messages": [{"role": "user", "content": "Calculate 2 + 2."}], "max_tokens": 8,
            "temperature": 0}, timeout=120)
        seed = requests.get(base + "/reef/harness", headers=h, timeout=30).json()
        lines += [f"- before any report: `x-reef-release-id` {first.headers.get('x-reef-release-id')}, "
                  f"`GET /reef/harness` -> {seed['release_id']} `{json.dumps(seed['files'])}`"]
        t0 = time.time()
        res = procs.run(client_cmd, cwd=ROOT, capture_output=True, text=True)
        (out / "client.log").write_text(res.stdout + res.stderr)
        rel = requests.get(f"{base}/reef/scenarios/{SCENARIO}/releases", headers=h, timeout=30).json()
        ln = rel.get("learner") or {}
        lines += [f"- client: {args.rollouts} questions and reports in {time.time() - t0:.0f} s (exit code "
                  f"{res.returncode}); learner: {ln.get('rounds')} GEPA iterations, {ln.get('candidates')} "
                  f"candidates, {ln.get('metric_calls')} metric calls, {ln.get('examples')} examples, "
                  f"last error {ln.get('last_error')}"]
        lines += ["", "| release | parent | GEPA candidate | rewrote | validation mean | serving's before |",
                  "|---|---|---|---|---|---|"]
        for r in rel["releases"]:
            g = r.get("gepa") or {}
            lines.append(f"| {r['release_id']} | {r['parent']} | {g.get('candidate')} | {g.get('changed') or '-'} | "
                         f"{g.get('val_mean', '-')} | {g.get('serving_val_mean', '-')} |")
        now = requests.get(base + "/reef/harness", headers=h, timeout=30).json()
        nxt = requests.post(base + "/v1/chat/completions", headers=h, json={
            "model": "default", "messages": [{"role": "user", "content": "Calculate 17 + 25."}], "max_tokens": 48,
            "temperature": 0}, timeout=120)
        rid = nxt.headers.get("x-reef-agent-record-id")
        record = requests.get(f"{base}/reef/scenarios/{SCENARIO}/records/{rid}", headers=h, timeout=30).json()
        served = (record.get("artifact_ref") or {}).get("release_id") or record.get("release_id")
        lines += ["", f"- serving now: {rel['serving']}; `GET /reef/harness` -> {now['release_id']}:", "", "```json",
                  json.dumps(now["files"], indent=1), "```", "",
                  f"- the next request (`Calculate 17 + 25.`): `x-reef-release-id` "
                  f"{nxt.headers.get('x-reef-release-id')}, its record names release {served}; answer "
                  f"{nxt.json()['choices'][0]['message']['content']!r}",
                  f"- new harness release served without a restart: "
                  f"{rel['serving'] != seed['release_id'] and nxt.headers.get('x-reef-release-id') == rel['serving']}",
                  "", f"Total wall time {time.time() - started:.0f} s on this machine (2 CPU cores, "
                  "SmolLM2-135M-Instruct as task and reflection model).", "", "Client output (tail):", "", "```",
                  *res.stdout.strip().splitlines()[-8:], "```"]
        Path(args.page).write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    finally:
        server.stop(60)


if __name__ == "__main__":
    main()
