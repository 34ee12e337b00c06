"""The Hub and W&B flow as a new user would run it, end to end, with a Hub-compatible server on loopback.

    python scripts/studies/check_hub_flow.py [--rollouts 96] [--out runs/hub-flow]

1. starts `python -m reef_lab.testing.hub_server` (the loopback Hub) and runs the SAO arithmetic example with
   `hub.repo=me/reef-{scenario}` (HF_ENDPOINT, HF_TOKEN pointed at it), two releases;
2. `hf download me/reef-sao-arithmetic --revision v2 --local-dir <empty>`, loads it with transformers and checks
   its greedy answers on the held-out items equal those of the run's release v2;
3. starts `scripts/serve.py` on the run's data dir with `--hub-repo`, rolls back to v1, and checks that `main`
   moved to v1's files while the tags stayed;
4. reads the experiment's offline W&B run back with `wandb leet inspect --json`;
and writes what it saw to results/hub-flow.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import requests

from reef_lab import procs
from reef_lab.testing import free_port
from reef_lab.testing.processes import start_child, start_server
from scripts.common import ROOT
from scripts.command_line import command_line, repo_path

TOKEN = "flow-token"
REPO = "me/reef-sao-arithmetic"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", type=int, default=96)
    p.add_argument("--out", default=str(ROOT / "runs" / "hub-flow"), help="run folder (emptied first)")
    args = p.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    py, bin_dir = sys.executable, Path(sys.executable).parent
    hub_port = free_port()
    hub_url = f"http://127.0.0.1:{hub_port}"
    # Only what the README tells a user to set (HF_ENDPOINT, HF_TOKEN); HF_HOME keeps this check's cache apart.
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))},
           "HF_ENDPOINT": hub_url, "HF_TOKEN": TOKEN, "HF_HOME": str(out / "hf-home"), "WANDB_MODE": "offline"}
    log = []
    hub = start_child([py, "-m", "reef_lab.testing.hub_server", "--root", str(out / "hub"), "--port", str(hub_port),
                       "--token", TOKEN], hub_port, out / "hub.log", ready_path="/api/whoami-v2", base_env=env)
    serve = None
    try:
        cmd = [py, "scripts/run_experiment.py", "recipes/sao/examples/arithmetic.yaml", "--out", str(out / "run"),
               "--set", f"rollouts={args.rollouts}", "--set", "recipe_config.steps_per_candidate=2",
               "--set", "recipe_config.critic_warmup_steps=1", "--set", "hub.repo=me/reef-{scenario}"]
        started = time.time()
        procs.run(cmd, cwd=ROOT, env=env, check=True)
        log.append(f"experiment: `{command_line(cmd[1:])}` ({time.time() - started:.0f} s)")
        index = json.loads((out / "run/data/releases/sao-arithmetic/index.json").read_text())
        for r in index["releases"]:
            log.append(f"release {r['release_id']}: hub {r['hub']['state']}, commit {r['hub'].get('commit')}, "
                       f"tag {r['hub'].get('tag')}, held-out {r['eval']['accuracy']}")

        dl = out / "v2"
        procs.run([str(bin_dir / "hf"), "download", REPO, "--revision", "v2", "--local-dir", str(dl)],
                  env=env, check=True, capture_output=True)
        log.append(f"`hf download {REPO} --revision v2 --local-dir {repo_path(dl)}`: "
                   f"{sorted(p.name for p in dl.iterdir())}")
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(dl)
        from reef_lab.engines.base import ChatRequest, SamplingParams
        from reef_lab.engines.embedded import EmbeddedEngine
        from reef_lab.tasks.base import make_task

        items = make_task({"operators": ["+", "-"]}).items(16, seed=999_983)
        v2 = next(r for r in index["releases"] if r["version"] == "v2")

        def answers(folder):
            with EmbeddedEngine.from_path(str(folder)) as eng:
                hs = [eng.submit(ChatRequest(it["messages"], SamplingParams(max_tokens=32, temperature=0)))
                      for it in items]
                return [h.result().text for h in hs]
        same = answers(dl) == answers(v2["folder"])
        log.append(f"downloaded v2 loaded with transformers; greedy answers on 16 held-out items equal to the "
                   f"serving release v2's: {same}")

        serve = start_server("--hub-repo", "me/reef-{scenario}", "--log-level", "warning", data_dir=out / "run/data",
                             log=out / "serve.log", base_env=env, timeout=300)
        base = serve.url
        from huggingface_hub import HfApi

        api = HfApi(endpoint=hub_url, token=TOKEN)
        before = api.list_repo_refs(REPO)
        r = requests.post(base + "/reef/scenarios/sao-arithmetic/rollback", json={"release_id": "v1"}, timeout=60)
        r.raise_for_status()
        deadline = time.time() + 120
        while time.time() < deadline:
            state = (requests.get(base + "/reef/scenarios/sao-arithmetic/releases").json().get("hub_main") or {})
            if state.get("state") in ("pushed", "failed"):
                break
            time.sleep(0.5)
        after = api.list_repo_refs(REPO)
        main_of = lambda refs: next(b.target_commit for b in refs.branches if b.name == "main")  # noqa: E731
        tags_of = lambda refs: {t.name: t.target_commit for t in refs.tags}  # noqa: E731
        v1_dl = out / "v1"
        main_dl = out / "main"
        for rev, d in (("v1", v1_dl), ("main", main_dl)):
            procs.run([str(bin_dir / "hf"), "download", REPO, "--revision", rev, "--local-dir", str(d)],
                      env=env, check=True, capture_output=True)
        same_files = (v1_dl / "model.safetensors").read_bytes() == (main_dl / "model.safetensors").read_bytes()
        log.append(f"rollback to v1 through the API: hub_main {state.get('state')}; main {main_of(before)[:8]} -> "
                   f"{main_of(after)[:8]}; tags before {tags_of(before)} after {tags_of(after)} (unchanged: "
                   f"{tags_of(before) == tags_of(after)}); main's weights equal v1's: {same_files}")

        for folder in sorted((out / "run/data/wandb").glob("offline-run-*")):  # the experiment's, not serve.py's
            res = procs.run([str(bin_dir / "wandb"), "leet", "inspect", "--json", str(folder)],
                            capture_output=True, text=True, check=True)
            recs = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
            run = next(x["run"] for x in recs if x["type"] == "run")
            if run.get("run_group") == "sao-arithmetic":
                break
        runs = [folder]
        hist = [x for x in recs if x["type"] == "history"]
        keys = sorted({k for h in hist for k in h["history"]["item"]})  # {metric: value} per history row
        log.append(f"W&B offline run {runs[0].name}: name {run['display_name']}, group {run['run_group']}, "
                   f"{len(hist)} history rows, config keys {sorted(run['config']['update'])}; metrics "
                   f"{[k for k in keys if not k.startswith('_')]}")
    finally:
        for child in (serve, hub):
            if child is not None:
                child.stop(30)
    page = ROOT / "results" / "hub-flow.md"
    page.write_text("# Releases on a Hub, runs in W&B: the flow end to end\n\n"
                    f"Command: `{command_line()}` (loopback Hub: `reef_lab/testing/hub_server.py`; "
                    f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n" + "\n".join(f"- {x}" for x in log)
                    + "\n")
    print(page.read_text())


if __name__ == "__main__":
    main()
