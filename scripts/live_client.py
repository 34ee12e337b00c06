"""A client for the live learning loop: asks a task's questions (arithmetic by default; any task by name with
`--task`) through the official openai SDK, scores each answer with the task's own scorer and reports the score to
/reef/report, then shows the scenario's releases with the held-out accuracy of each.

    python scripts/serve.py --recipe sao --recipe-config recipes/sao/examples/live.yaml      # terminal 1
    python scripts/live_client.py --rollouts 256                                              # terminal 2

For a harness recipe (GEPA), send the verifier's feedback text and the reference answer with each report:

    python scripts/serve.py --recipe gepa --recipe-config recipes/gepa/examples/live.yaml
    python scripts/live_client.py --feedback --temperature 0 --max-tokens 48 --rollouts 48

Any task: `--task jsonl --task-config '{path: questions.jsonl}'`, or a plug-in `--task mymodule:MyTask` (with
`--task-config '{options: {...}}'`), the same names and fields as a recipe's eval_task (reef_lab.tasks.base).

The server trains in the background as reports arrive; the client keeps `--concurrency` questions in flight and,
like the experiment runner, waits while the learner's pool is full (GET /reef/scenarios/{s}/releases says).
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor


import requests
import yaml
from openai import OpenAI

from reef_lab.tasks.base import TaskConfig, make_task
from reef_lab.schema import build

ARITHMETIC = {"operators": ["+", "-"], "min_digits": 1, "max_digits": 2}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8900")
    p.add_argument("--scenario", default="arithmetic-live")
    p.add_argument("--rollouts", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-pool", type=int, default=16, help="wait while the learner holds this many samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--feedback", action="store_true",
                   help="report the verifier's feedback text and metadata.answer (what the gepa recipe learns from)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--wait", type=float, default=900, help="seconds to wait for training to finish at the end")
    p.add_argument("--task", default="arithmetic",
                   help="the task: arithmetic, jsonl, choice or a module:Class of a reef_lab.tasks.base.Task")
    p.add_argument("--task-config", default=None,
                   help="the task's other TaskConfig fields as a YAML/JSON mapping, e.g. '{path: q.jsonl}' (default "
                        f"for arithmetic: {ARITHMETIC})")
    args = p.parse_args(argv)
    try:
        fields = yaml.safe_load(args.task_config) if args.task_config else (
            ARITHMETIC if args.task == "arithmetic" else {})
        task = make_task(build(TaskConfig, {**(fields or {}), "name": args.task}, "task"))
    except (ValueError, yaml.YAMLError) as e:
        p.error(str(e))
    token = os.environ.get("REEF_TOKEN", "").split(",")[0] or "none"
    client = OpenAI(base_url=args.url + "/v1", api_key=token, default_headers={"x-reef-scenario": args.scenario})
    auth = {"Authorization": f"Bearer {token}", "x-reef-scenario": args.scenario}
    items = task.items(args.rollouts, seed=args.seed)

    def learner() -> dict:
        r = requests.get(f"{args.url}/reef/scenarios/{args.scenario}/releases", headers=auth, timeout=30)
        return r.json().get("learner") or {}

    scores = []

    def one(k: int) -> None:
        while (ln := learner()) and ln.get("pool", 0) + ln.get("inbox", 0) >= args.max_pool:
            time.sleep(0.2)
        item = items[k]
        raw = client.chat.completions.with_raw_response.create(
            model="default", messages=item["messages"], max_tokens=args.max_tokens, temperature=args.temperature,
            seed=args.seed * 100_003 + k)
        answer = raw.parse().choices[0].message.content or ""
        score = float(task.score(item, answer))
        report = {"score": score, "references": [raw.headers["x-reef-agent-record-id"]]}
        if args.feedback:
            report["feedback"] = task.feedback(item, answer)
            if item.get("answer") is not None:
                report["metadata"] = {"answer": item["answer"]}
        r = requests.post(f"{args.url}/reef/report", headers=auth, timeout=30, json=report)
        r.raise_for_status()
        scores.append(score)
        if len(scores) % 16 == 0:
            recent = scores[-16:]
            print(f"[client] {len(scores)}/{args.rollouts} rollouts, last 16 reward {sum(recent) / 16:.3f}, "
                  f"release {raw.headers['x-reef-release-id']}", flush=True)

    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(one, range(args.rollouts)))
    deadline = time.time() + args.wait
    while time.time() < deadline and (ln := learner()) and (ln.get("phase") != "idle" or ln.get("inbox")):
        time.sleep(1)
    rel = requests.get(f"{args.url}/reef/scenarios/{args.scenario}/releases", headers=auth, timeout=30).json()
    base = (rel.get("base_eval") or {}).get("accuracy")
    print(f"[client] serving {rel['serving']}; held-out accuracy: base {base}")
    for r in rel["releases"]:
        print(f"[client]   {r['release_id']} (parent {r['parent']}, {r.get('kind') or 'weights'}, trainer step "
              f"{r.get('trainer_step')}): held-out/validation {(r.get('eval') or {}).get('accuracy')}")


if __name__ == "__main__":
    main()
