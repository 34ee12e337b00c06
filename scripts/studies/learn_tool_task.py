"""Learning a tool task live: SFT on imported calculator demonstrations, held-out tool episodes before and after.

What a user would do, end to end against `scripts/serve.py` (the embedded SmolLM2-135M, recipe sft with
recipes/sft/examples/tools.yaml), started here as a child that dies with this script, a fresh one per seed (each
seed starts from the base weights):
1. the base model runs the held-out episodes through the OpenAI SDK tool loop (chat completions with `tools`, the
   tool results sent back as `role: tool` messages; greedy) in a records-only scenario, all episodes of all tasks at
   once (the embedded engine batches them); each episode is scored by its task's verifier and reported on its
   receipts (POST /reef/report);
2. per seed, demonstrations of calculator items drawn with seed 100+s (disjoint from the held-out items, seed 1000;
   checked) are imported as one `train` record per assistant turn, with the token ids the engine templates
   (reef_lab/tasks/demos.py), the first `--samples` turns; steps_per_candidate POST /reef/train rounds
   (manual mode) make release v1, which then serves the scenario;
3. the release runs the same held-out episodes (calculator and BFCL v4), scored and reported the same way;
4. (`--policy grpo`, the default) a fresh server on the SFT release's weights with the GRPO recipe: sampled
   calculator episodes (items seed 200+s), each its own session tagged with its item, reported on the episode, which
   the learner trains on as one masked sample; its releases then run the same held-out episodes. Its run folder
   opens in the SAO app (tool-call validity and task success per step).
Writes <out>.md, <out>.png and its JSON (every episode, with its transcript; results/data/ for a page in results/).

    .venv/bin/python scripts/studies/learn_tool_task.py --seeds 0 1 2 --out results/agents-learn
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from reef_lab.engines.embedded import DEFAULT_MODEL_NAME, default_cache_dir
from reef_lab.engines.remote import ChatTokenizer
from reef_lab.tasks.base import make_task
from reef_lab.tasks.demos import calculator_episode, turn_records
from reef_lab.tasks.tools import ToolTask
from reef_lab.procs import Popen
from reef_lab.testing import free_port, wait_http
from scripts.common import ROOT, clopper_pearson, pyplot, t_interval
from scripts.command_line import command_line, data_file

EVAL_SEED, BFCL_SEED = 1000, 0
TABLES, TABLES_END = "<!-- tables: written by scripts/studies/learn_tool_task.py -->", "<!-- /tables -->"


# ---- the client: an SDK's tool loop, receipts, reports --------------------------------------------------------------
class ReceiptChat:
    """A ToolChat over the OpenAI SDK (chat completions with `tools`, results sent back as `role: tool` messages)
    that keeps each reply's receipt (x-reef-agent-record-id). Greedy unless a temperature is given; `headers` go on
    every call (a rollout's session and group)."""

    def __init__(self, client, scenario: str, max_tokens: int, temperature: float = 0.0,
                 headers: dict | None = None):
        self.client, self.scenario, self.max_tokens = client, scenario, max_tokens
        self.temperature, self.headers = temperature, headers or {}
        self.receipts: list[str] = []
        self.releases: set[str] = set()

    def __call__(self, messages, tools):
        raw = self.client.chat.completions.with_raw_response.create(
            model="smollm2", messages=messages, **({"tools": tools} if tools else {}), max_tokens=self.max_tokens,
            temperature=self.temperature, extra_headers={"x-reef-scenario": self.scenario, **self.headers})
        self._keep(raw.headers)
        return raw.parse().choices[0].message.model_dump(exclude_none=True)

    def _keep(self, headers) -> None:
        self.receipts.append(headers["x-reef-agent-record-id"])
        self.releases.add(headers.get("x-reef-release-id", "?"))


class AnthropicReceiptChat(ReceiptChat):
    """The same loop through the Anthropic SDK against /v1/messages: `tools` with `input_schema`, the model's
    `tool_use` blocks, results sent back as `tool_result` blocks. The task keeps its history in chat form, so each
    call's body is written in Anthropic's form (and each answer read back) by reef_lab's own translator
    (reef_lab/wire/translate), what the server's relay uses between these two dialects."""

    def __call__(self, messages, tools):
        from reef_lab.wire import ANTHROPIC, OPENAI_CHAT
        from reef_lab.wire.translate import Translation

        tr = Translation(OPENAI_CHAT, ANTHROPIC, {"model": "smollm2", "messages": messages,
                                                   **({"tools": tools} if tools else {}),
                                                   "max_tokens": self.max_tokens, "temperature": self.temperature})
        body = {k: v for k, v in tr.body.items() if k != "stream"}
        # anthropic 2.16's create() has no sampling arguments (temperature, top_p): they go as extra_body, as a user
        # of this SDK would send them
        extra = {k: body.pop(k) for k in ("temperature", "top_p", "top_k") if k in body}
        raw = self.client.messages.with_raw_response.create(
            **body, extra_body=extra, extra_headers={"x-reef-scenario": self.scenario, **self.headers})
        self._keep(raw.headers)
        answer = tr.answer(raw.parse().model_dump(exclude_none=True))
        return {k: v for k, v in answer["choices"][0]["message"].items() if v is not None}


def sdk_client(kind: str, url: str):
    """(the SDK's client against the server, its ToolChat class, its status error)."""
    if kind == "anthropic":
        import anthropic

        return (anthropic.Anthropic(base_url=url, api_key="none", timeout=3600, max_retries=1),
                AnthropicReceiptChat, anthropic.APIStatusError)
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=3600, max_retries=1), ReceiptChat, \
        openai.APIStatusError


def run_episodes(url: str, sdk, scenario: str, jobs: dict, report: bool = True) -> dict:
    """Every held-out episode of every task at once (the embedded engine batches them): `jobs` maps a task name to
    (task, items, max_tokens, max_turns). Each episode is scored and reported on its receipts (`report` False: not
    reported, for a scenario whose learner would train on the reports)."""
    def one(job):
        name, item = job
        task, _, max_tokens, max_turns = jobs[name]
        client, chat_cls, APIStatusError = sdk
        chat = chat_cls(client, scenario, max_tokens)
        if not isinstance(task, ToolTask):  # a plain task (the retention task): one reply, its verifier's score
            score, text = task.rollout(chat, item)
            if report:
                _retrying("POST", f"{url}/reef/report", json={"score": score, "references": chat.receipts,
                                                              "metadata": {"item": item["id"]}},
                          headers={"x-reef-scenario": scenario}).raise_for_status()
            return name, {"id": item["id"], "score": score, "correct": score == 1.0, "valid_calls": 0,
                          "invalid_calls": 0, "feedback": task.feedback(item, text), "turns": 1,
                          "releases": sorted(chat.releases), "receipts": chat.receipts,
                          "transcript": [{"role": "assistant", "content": text}]}
        try:
            ep = task.run_episode(chat, item, max_turns)
        except APIStatusError as e:  # one failed episode is data: score 0, the server's error kept
            return name, {"id": item["id"], "score": 0.0, "correct": False, "valid_calls": 0, "invalid_calls": 0,
                          "feedback": f"server error: {e}", "turns": len(chat.receipts) + 1, "server_error": str(e),
                          "releases": sorted(chat.releases), "receipts": chat.receipts, "transcript": []}
        verdict = task.score_episode(item, ep.transcript)
        if report:
            _retrying("POST", f"{url}/reef/report", json=verdict.report(chat.receipts, item["id"]),
                      headers={"x-reef-scenario": scenario}).raise_for_status()
        return name, {"id": item["id"], "score": verdict.score, "correct": verdict.correct,
                      "valid_calls": verdict.valid_calls, "invalid_calls": verdict.invalid_calls,
                      "feedback": verdict.feedback, "turns": ep.turns, "releases": sorted(chat.releases),
                      "receipts": chat.receipts, "transcript": ep.transcript}

    started = time.perf_counter()
    work = [(name, it) for name, (_, items, _, _) in jobs.items() for it in items]
    with ThreadPoolExecutor(len(work)) as pool:
        done = list(pool.map(one, work))
    wall = round(time.perf_counter() - started, 1)
    out = {}
    for name in jobs:
        rows = [r for n, r in done if n == name]
        k, n = int(sum(r["score"] for r in rows)), len(rows)
        valid = sum(r["valid_calls"] for r in rows)
        calls = valid + sum(r["invalid_calls"] for r in rows)
        lo, hi = clopper_pearson(k, n)
        out[name] = {"scenario": scenario, "n": n, "success": k, "accuracy": k / n, "ci95": [lo, hi],
                     "tool_calls": calls, "valid_calls": valid,
                     "valid_call_fraction": valid / calls if calls else None,
                     "episodes_with_calls": sum(1 for r in rows if r["valid_calls"] + r["invalid_calls"]),
                     "episodes_with_valid_calls": sum(1 for r in rows if r["valid_calls"]),
                     "server_errors": sum(1 for r in rows if r.get("server_error")),
                     "wall_s": wall, "episodes": rows}
        print(f"[learn] {scenario} {name}: {k}/{n}, {out[name]['episodes_with_valid_calls']} with a valid call "
              f"({wall} s, all tasks together)", file=sys.stderr, flush=True)
    return out


def policy_rollouts(url: str, sdk, scenario: str, task, items: list[dict], group: int, max_tokens: int,
                    max_turns: int, temperature: float, concurrency: int, log_path: Path,
                    first: int = 0) -> list[dict]:
    """The policy stage's rollouts: `group` sampled episodes of each item through the same OpenAI SDK tool loop,
    each its own session (`x-reef-session`, so the server groups its calls into one episode) tagged with its item
    (`x-reef-tag-group`, GRPO's group); each is scored by the task's verifier and reported on the episode
    (`{"score", "episode", "metadata"}`), which the learner trains on as one masked sample. `first`: the number
    of the first episode in the log (a later round's)."""
    import uuid

    client, chat_cls, APIStatusError = sdk
    log = open(log_path, "ab")

    def one(k: int) -> dict:
        item = items[k // group]
        session = f"rollout-{uuid.uuid4().hex}"
        chat = chat_cls(client, scenario, max_tokens, temperature,
                           {"x-reef-session": session, "x-reef-tag-group": item["id"]})
        try:
            ep = task.run_episode(chat, item, max_turns)
        except APIStatusError as e:  # a failed episode is not reported (it trains nothing); counted
            row = {"k": first + k, "item": item["id"], "error": str(e), "time": time.time()}
        else:
            verdict = task.score_episode(item, ep.transcript)
            body = {**verdict.report([], item["id"]), "episode": session}
            del body["references"]
            _retrying("POST", f"{url}/reef/report", json=body,
                      headers={"x-reef-scenario": scenario}).raise_for_status()
            row = {"k": first + k, "item": item["id"], "release": sorted(chat.releases)[0] if chat.releases else None,
                   "score": verdict.score, "valid_calls": verdict.valid_calls,
                   "invalid_calls": verdict.invalid_calls, "turns": ep.turns, "time": time.time()}
        log.write((json.dumps(row) + "\n").encode())
        log.flush()
        return row

    with ThreadPoolExecutor(concurrency) as pool:
        rows = list(pool.map(one, range(len(items) * group)))
    log.close()
    return rows


def wait_releases(url: str, scenario: str, count: int, timeout: float) -> dict:
    """Wait until the learner has trained on what it can: `count` releases made, or (if some episodes could not
    be trained, e.g. split, dropped or short of a whole group) idle at the same trainer step for six polls in a
    row (30 s). A failed round stops the wait with its error."""
    deadline, quiet, last_step = time.time() + timeout, 0, None
    while time.time() < deadline:
        rels = _retrying("GET", f"{url}/reef/scenarios/{scenario}/releases").json()
        learner = _retrying("GET", f"{url}/reef/status").json()["learners"].get(scenario) or {}
        if learner.get("last_error"):
            raise RuntimeError(f"{scenario}: training failed: {learner['last_error']}")
        idle = learner.get("phase") == "idle" and not learner.get("inbox")
        if idle and len(rels.get("releases") or []) >= count:
            return rels
        step = learner.get("trainer_step")
        quiet = quiet + 1 if idle and step == last_step else 0
        last_step = step
        if quiet >= 6:
            if not rels.get("releases"):
                raise RuntimeError(f"{scenario}: the learner is idle with no release ({learner})")
            return rels
        time.sleep(5)
    raise TimeoutError(f"{scenario}: {count} releases not made within {timeout:.0f} s")


# ---- the server --------------------------------------------------------------------------------------------------
def fresh_dir(path: Path) -> Path:
    """A run's server data dir, refused when an earlier run left records there: a server started on them learns from
    the old run's records too, so the same seed would no longer give the same run."""
    records = path / "records"
    if records.is_dir() and any(records.iterdir()):
        raise SystemExit(f"{path} holds an earlier run's records: remove that folder or give another --data-dir")
    path.mkdir(parents=True, exist_ok=True)
    return path


def start_server(data_dir: Path, port: int, recipe_config: str, max_batch: int, model_path: str | None,
                 recipe: str = "sft", engine: str = "embedded") -> Popen:
    """scripts/serve.py as a child that dies with this script; `engine` vllm: a vLLM CPU server (.venv-vllm) that
    serves the model and its releases (weights transport: LoRA-trained releases reloaded in place)."""
    log = open(data_dir / "serve.log", "ab")
    proc = Popen([sys.executable, str(ROOT / "scripts" / "serve.py"), "--port", str(port), "--data-dir",
                  str(data_dir), "--recipe", recipe, "--recipe-config", str(ROOT / recipe_config), "--max-batch",
                  str(max_batch), "--log-level", "warning", "--read-timeout", "300", "--engine", engine,
                  *(["--engine_options", json.dumps({"port": free_port()})] if engine == "vllm" else []),
                  *(["--model-path", model_path] if model_path else [])],
                 cwd=ROOT, stdout=log, stderr=log, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.time() + 900
    while True:  # a server that fails to start says so at once, not after the wait
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", timeout=5)
            return proc
        except TimeoutError:
            if proc.poll() is not None:
                raise RuntimeError(f"serve.py exited with {proc.returncode} before it was ready: see "
                                   f"{data_dir / 'serve.log'}") from None
            if time.time() > deadline:
                proc.stop(30)
                raise


def _retrying(method: str, url: str, tries: int = 5, **kwargs) -> requests.Response:
    """A call that survives a reset connection: on a starved CPU the server's reader thread can miss its read
    timeout and drop a connection before the request was read (seen while polling during training). A reset after
    the server had read a report would store it twice; the episodes' results here do not depend on stored reports."""
    for i in range(tries):
        try:
            return requests.request(method, url, timeout=1800, **kwargs)
        except requests.ConnectionError:
            if i == tries - 1:
                raise
            time.sleep(5)
    raise AssertionError("unreachable")


def train_release(url: str, scenario: str, records: list[dict], steps: int, timeout: float) -> dict:
    r = requests.post(f"{url}/reef/records/batch", json={"records": records}, timeout=300)
    r.raise_for_status()
    for _ in range(steps):
        r = requests.post(f"{url}/reef/train", headers={"x-reef-scenario": scenario}, timeout=120)
        if r.status_code != 202:
            raise RuntimeError(f"POST /reef/train: {r.status_code} {r.text}")
    deadline = time.time() + timeout
    while time.time() < deadline:
        rels = _retrying("GET", f"{url}/reef/scenarios/{scenario}/releases").json()
        if rels.get("serving") not in (None, "base"):
            return rels
        learner = _retrying("GET", f"{url}/reef/status").json()["learners"].get(scenario) or {}
        if learner.get("last_error"):
            raise RuntimeError(f"{scenario}: training failed: {learner['last_error']}")
        time.sleep(5)
    raise TimeoutError(f"{scenario}: no release within {timeout:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2], help="none: the base run only")
    ap.add_argument("--demos", type=int, default=32, help="demonstration episodes drawn per seed")
    ap.add_argument("--samples", type=int, default=64, help="demonstration turns imported per seed (the first ones)")
    ap.add_argument("--n", type=int, default=20, help="held-out items per task")
    ap.add_argument("--tasks", nargs="+", default=["calculator", "calculator-unseen", "bfcl", "colors"],
                    choices=["calculator", "calculator-unseen", "bfcl", "colors"],
                    help="held-out tasks: calculator (the trained tools), calculator-unseen (the same sums with tools "
                         "the release never saw: sum_of/product_of), bfcl (BFCL v4, other domains), colors (no tools: "
                         "a retention task the base model does, what the release keeps of it)")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each calculator reply")
    ap.add_argument("--bfcl-max-tokens", type=int, default=96, help="max_tokens of each BFCL reply")
    ap.add_argument("--max-turns", type=int, default=4, help="model replies per calculator episode")
    ap.add_argument("--recipe-config", default="recipes/sft/examples/tools.yaml")
    ap.add_argument("--model-path", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--skip-base", action="store_true", help="keep the base run already in <out>'s JSON")
    ap.add_argument("--no-base", action="store_true", help="run the seeds only (merge the base in later)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="run nothing: join the runs of these result files into <out> and write its pages")
    ap.add_argument("--sft-from", default=None, metavar="DATA_DIR",
                    help="run the policy stage only, from the SFT releases an earlier run left in DATA_DIR "
                         "(its --data-dir: seed-<s>/releases/tools-sft-s<s>/v1)")
    ap.add_argument("--client", choices=["openai", "anthropic"], default="openai",
                    help="the SDK whose tool loop runs every episode: openai (chat completions) or anthropic "
                         "(messages, tool_use / tool_result blocks)")
    ap.add_argument("--policy", choices=["none", "grpo", "sao"], default="grpo",
                    help="after SFT, a policy stage on sampled episodes from the SFT release (none: SFT only)")
    ap.add_argument("--policy-engine", choices=["embedded", "vllm"], default="embedded",
                    help="policy stage: the engine that samples its rollouts and serves its releases; vllm (bash "
                         "scripts/setup.sh --vllm) trains LoRA releases (recipes/grpo/examples/tools-lora.yaml) and "
                         "first runs the SFT release's held-out episodes on vLLM too (run tools-sft-vllm-s<seed>)")
    ap.add_argument("--policy-config", default=None,
                    help="the policy recipe's config (auto mode: it trains as episode reports arrive); default: "
                         "recipes/grpo/examples/tools.yaml, tools-lora.yaml with --policy-engine vllm")
    ap.add_argument("--tag", default="", help="policy stage: a suffix of its arm's name, to keep runs of other "
                                              "budgets apart (tools-grpo-vllm-<tag>-s<seed>)")
    ap.add_argument("--rollouts", type=int, default=128, help="policy stage: sampled episodes per seed (per round)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="policy stage: rounds of --rollouts episodes, each sampled from the release the previous "
                         "round made (on-policy), new items each round")
    ap.add_argument("--temperature", type=float, default=1.0, help="policy stage: sampling temperature")
    ap.add_argument("--concurrency", type=int, default=16, help="policy stage: episodes in flight")
    ap.add_argument("--data-dir", default="runs/learn-tool-task", help="one server data dir per seed below it")
    ap.add_argument("--out", default="results/agents-learn")
    args = ap.parse_args()

    if args.merge:
        out = merge_results(args.merge)
        out["runs"] = {k: out["runs"][k] for k in sorted(out["runs"], key=lambda k: (k != "base", k))}
        _save(out, args.out)
        return

    import yaml

    rc = yaml.safe_load((ROOT / args.recipe_config).read_text())
    steps = args.samples // rc["batch_size"]
    if steps * rc["batch_size"] != args.samples or steps != rc["steps_per_candidate"]:
        raise SystemExit(f"--samples {args.samples} must be steps_per_candidate x batch_size of {args.recipe_config} "
                         f"({rc['steps_per_candidate']} x {rc['batch_size']}): one release from one pass")
    out = {"command": command_line(), "args": vars(args), "recipe_config": rc, "steps": steps,
           "runs": {}}
    if args.skip_base:
        out["runs"]["base"] = json.loads(data_file(args.out).read_text())["runs"]["base"]
    calc = make_task({"name": "calculator", "options": {"max_turns": args.max_turns}})
    tasks = {"calculator": (calc, EVAL_SEED, args.max_tokens, args.max_turns),
             "calculator-unseen": (make_task({"name": "calculator", "options": {
                 "max_turns": args.max_turns, "schema": "unseen"}}), EVAL_SEED, args.max_tokens, args.max_turns),
             "bfcl": (make_task({"name": "bfcl"}), BFCL_SEED, args.bfcl_max_tokens, 1),
             "colors": (make_task({"name": "colors"}), EVAL_SEED, 12, 1)}
    held = {name: task.items(args.n, seed) for name, (task, seed, _, _) in tasks.items()}
    jobs = {name: (tasks[name][0], held[name], tasks[name][2], tasks[name][3]) for name in args.tasks}
    held_exprs = {it["expression"] for it in held["calculator"]}
    t0 = time.perf_counter()
    if args.sft_from:
        if args.policy == "none":
            raise SystemExit("--sft-from runs the policy stage only: give --policy")
        folders = {s: Path(args.sft_from) / f"seed-{s}" / "releases" / f"tools-sft-s{s}" / "v1" for s in args.seeds}
        missing = [str(f) for f in folders.values() if not (f / "config.json").is_file()]
        if missing:
            raise SystemExit(f"--sft-from: no SFT release at {', '.join(missing)}")
        for seed, folder in folders.items():
            policy_stage(args, seed, folder, calc, jobs, held_exprs, out)
            _save(out, args.out)
        out["wall_s"] = round(time.perf_counter() - t0, 1)
        _save(out, args.out)
        return
    for seed in (["base"] if not (args.skip_base or args.no_base) else []) + list(args.seeds):
        # a server per seed: each starts from the base weights, and a finished trainer's memory goes with it
        data = fresh_dir(Path(args.data_dir) / f"seed-{seed}")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start_server(data, port, args.recipe_config, 2 * args.n, args.model_path)
        try:
            sdk = sdk_client(args.client, url)
            if seed == "base":
                requests.post(f"{url}/reef/scenarios", json={"name": "tools-base", "recipe": "basic"},
                              timeout=60).raise_for_status()
                out["runs"]["base"] = {"eval": run_episodes(url, sdk, "tools-base", jobs)}
                _save(out, args.out)
                continue
            chat_tok = ChatTokenizer.from_folder(model_folder(args.model_path))
            scenario = f"tools-sft-s{seed}"
            items = calc.items(args.demos, 100 + seed)
            overlap = held_exprs & {it["expression"] for it in items}
            if overlap:
                raise SystemExit(f"demonstration items overlap the held-out ones: {sorted(overlap)[:3]}")
            turns = [r for it in items for r in turn_records(chat_tok, it, calculator_episode(it), scenario)]
            if len(turns) < args.samples:
                raise SystemExit(f"seed {seed}: {len(turns)} demonstration turns, fewer than --samples {args.samples}")
            turns = turns[:args.samples]
            started = time.perf_counter()
            rels = train_release(url, scenario, turns, steps, timeout=7200)
            train_s = time.perf_counter() - started
            print(f"[learn] {scenario}: {rels['serving']} after {train_s:.0f} s", file=sys.stderr, flush=True)
            metrics = data / "learn" / scenario / "metrics.jsonl"
            rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
            out["runs"][scenario] = {
                "seed": seed, "demo_items": sorted({r["tags"]["item"] for r in turns}), "demo_turns": len(turns),
                "demo_episodes": len({r["tags"]["item"] for r in turns}),
                "release": rels["serving"], "train_s": round(train_s, 1),
                "losses": [r.get("loss") for r in rows if r.get("event") == "step"],
                "eval": run_episodes(url, sdk, scenario, jobs)}
            _save(out, args.out)
            sft_folder = Path(next(r["folder"] for r in rels["releases"] if r["release_id"] == rels["serving"]))
        finally:
            proc.stop(120)
        if args.policy != "none":
            policy_stage(args, seed, sft_folder, calc, jobs, held_exprs, out)
            _save(out, args.out)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    _save(out, args.out)


def merge_results(files: list[str]) -> dict:
    """Result files of runs made apart (one per seed) as one: the first's settings, every file's runs and command."""
    parts = [json.loads(Path(f).read_text()) for f in files]
    out = {**parts[0], "command": " ; ".join(p["command"] for p in parts), "runs": {}}
    for p in parts:
        out["runs"].update(p["runs"])
    return out


def policy_stage(args, seed: int, sft_folder: Path, calc, jobs: dict, held_exprs: set, out: dict) -> None:
    """A fresh server on the SFT release's weights with the policy recipe (auto mode), `--rollouts` sampled
    calculator episodes of items drawn with seed 200+s (disjoint from the held-out ones), reported per episode; when
    its releases are made, the same held-out episodes (run tools-<policy>[-vllm]-s<seed> of `out`). On vLLM the SFT
    weights first run the held-out episodes there too (run tools-sft-vllm-s<seed>): the policy's gain is then also
    paired with its start on the same engine. The run folder (config.json, data/, rollouts.jsonl, summary.json) is
    one the SAO app opens: it plots the reports' tool-call validity and task success per step."""
    import yaml

    vllm = args.policy_engine == "vllm"
    config = args.policy_config or f"recipes/grpo/examples/tools{'-lora' if vllm else ''}.yaml"
    rc = yaml.safe_load((ROOT / config).read_text())
    group = rc.get("group_size", 1) if args.policy == "grpo" else 1
    per_release = rc["batch_size"] * rc["steps_per_candidate"]
    if args.rollouts % per_release or args.rollouts % group:
        raise SystemExit(f"--rollouts {args.rollouts} must be a multiple of batch_size x steps_per_candidate "
                         f"({per_release}) of {config}")
    if vllm and not (rc.get("trainer") or {}).get("lora_rank"):
        raise SystemExit(f"{config}: the vllm engine serves LoRA-trained releases only: set trainer.lora_rank")
    arm = f"tools-{args.policy}{'-vllm' if vllm else ''}{'-' + args.tag if args.tag else ''}"
    scenario = f"{arm}-s{seed}"
    run = Path(args.data_dir) / f"seed-{seed}" / arm.removeprefix("tools-")
    fresh_dir(run / "data")
    per_round = args.rollouts // group
    items = calc.items(args.rounds * per_round, 200 + seed)
    overlap = held_exprs & {it["expression"] for it in items}
    if overlap:
        raise SystemExit(f"policy items overlap the held-out ones: {sorted(overlap)[:3]}")
    (run / "config.json").write_text(json.dumps({
        "name": scenario, "recipe": args.policy, "seed": seed, "rollouts": args.rollouts * args.rounds,
        "group_size": group,
        "temperature": args.temperature, "max_tokens": args.max_tokens, "model_path": str(sft_folder),
        "engine": args.policy_engine,
        "task": {"name": "calculator", "options": {"max_turns": args.max_turns}}, "recipe_config": rc}, indent=1))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(run / "data", port, config, max(2 * args.n, args.concurrency), str(sft_folder),
                        recipe=args.policy, engine=args.policy_engine)
    try:
        sdk = sdk_client(args.client, url)
        if vllm:  # the start on this engine, in a records-only scenario (its reports train nothing)
            requests.post(f"{url}/reef/scenarios", json={"name": f"tools-sft-vllm-s{seed}", "recipe": "basic"},
                          timeout=60).raise_for_status()
            out["runs"][f"tools-sft-vllm-s{seed}"] = {"seed": seed, "from": str(sft_folder), "engine": "vllm",
                                                     "eval": run_episodes(url, sdk, f"tools-sft-vllm-s{seed}", jobs)}
            _save(out, args.out)
        started = time.perf_counter()
        rows = []
        for r in range(args.rounds):  # each round from the newest release: the server serves it once made
            part = policy_rollouts(url, sdk, scenario, calc, items[r * per_round:(r + 1) * per_round], group,
                                   args.max_tokens, args.max_turns, args.temperature, args.concurrency,
                                   run / "rollouts.jsonl", first=r * args.rollouts)
            rows += part
            reported = [x for x in rows if "score" in x]
            rels = wait_releases(url, scenario, len(reported) // per_release, timeout=7200)
            scores = [x["score"] for x in part if "score" in x]
            print(f"[learn] {scenario}: round {r + 1}/{args.rounds} sampled from {part[0].get('release')}: "
                  f"success {sum(scores) / max(1, len(scores)):.3f} of {len(scores)}; now serving {rels['serving']}",
                  file=sys.stderr, flush=True)
        train_s = time.perf_counter() - started
        print(f"[learn] {scenario}: {rels['serving']} after {train_s:.0f} s ({len(reported)} episodes reported)",
              file=sys.stderr, flush=True)
        metrics = run / "data" / "learn" / scenario / "metrics.jsonl"
        steps = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        steps = [r for r in steps if r.get("event") == "step"]
        ev = run_episodes(url, sdk, scenario, jobs)
        engine = _retrying("GET", f"{url}/reef/status").json()["engine"]
        (run / "summary.json").write_text(json.dumps({
            "name": scenario, "rollouts": len(rows), "final_accuracy": ev["calculator"]["accuracy"],
            "wall_s": round(time.perf_counter() - started, 1)}))
        out["runs"][scenario] = {
            "seed": seed, "from": str(sft_folder), "engine": args.policy_engine, "config": config,
            # what the server's engine said after the held-out episodes: which engine, which weights it held
            "served_by": {k: engine.get(k) for k in ("engine", "transport", "weights_serving", "release_id")},
            "run_dir": str(run), "release": rels["serving"],
                "releases": len(rels["releases"]), "rollouts": len(rows), "reported": len(reported),
                "rollout_success": sum(r["score"] for r in reported) / max(1, len(reported)),
                "train_s": round(train_s, 1),
                "steps": [{k: r.get(k) for k in ("trainer_step", "reward_mean", "loss", "report_correct",
                                                 "report_valid_call_fraction", "masked_fraction", "step_s")}
                          for r in steps],
                "eval": ev}
    finally:
        proc.stop(120)


def model_folder(model_path: str | None) -> Path:
    """The served model's folder (its tokenizer and chat template): the converted embedded default, or a folder."""
    if model_path is None:
        return default_cache_dir() / DEFAULT_MODEL_NAME
    if not Path(model_path).is_dir():
        raise SystemExit("--model-path must be a model folder here (the demonstrations need its tokenizer)")
    return Path(model_path)


def _save(out: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    data_file(path).write_text(json.dumps(out, indent=1))
    write_report(out, path)


def arm_of(run_name: str) -> str:
    """tools-sft-s0 -> tools-sft: runs of one arm differ only in their seed."""
    return run_name.rsplit("-s", 1)[0]


def summary(out: dict) -> dict:
    """Per arm and task: the base, each seed's release, and the mean over seeds with its t-interval; the gain over
    base (paired on the same items), and for a policy arm its gain over the SFT release of the same seed."""
    base = out["runs"].get("base", {}).get("eval", {})
    arms: dict[str, list[dict]] = {}
    for name, r in out["runs"].items():
        if name != "base":
            arms.setdefault(arm_of(name), []).append(r)
    table = {}
    for arm, seeds in arms.items():
        for task in out["args"]["tasks"]:
            runs = [r for r in seeds if task in r.get("eval", {})]
            if task not in base or not runs:
                continue
            accs = [r["eval"][task]["accuracy"] for r in runs]
            base_on = [_base_on(base[task], r["eval"][task]) for r in runs]
            gains = [a - b for a, b in zip(accs, base_on)]  # on the same items (a run may take a prefix of base's)
            row = {"arm": arm, "task": task, "base": base[task]["accuracy"], "base_ci95": base[task]["ci95"],
                   "seeds": accs, "base_on_seed_items": base_on, "mean": t_interval(accs), "gain": t_interval(gains),
                   "valid_call_fraction": [r["eval"][task]["valid_call_fraction"] for r in runs],
                   "episodes_with_valid_calls": [r["eval"][task]["episodes_with_valid_calls"] for r in runs],
                   # every seed's episodes together: successes of all held-out episodes, an exact interval
                   "pooled": [sum(r["eval"][task]["success"] for r in runs), sum(r["eval"][task]["n"] for r in runs)]}
            # a policy arm against the SFT release it started from, on its own engine; the SFT release on vLLM
            # against the same release on the embedded engine (the engine's own effect)
            start = "tools-sft-vllm" if "-vllm" in arm and arm != "tools-sft-vllm" else "tools-sft"
            sft = {r["seed"]: r for r in arms.get(start, [])}
            paired = [(r["eval"][task]["accuracy"], sft[r["seed"]]["eval"][task]["accuracy"]) for r in runs
                      if arm != start and r["seed"] in sft and task in sft[r["seed"]].get("eval", {})]
            if paired:
                row["gain_over_sft"] = t_interval([a - b for a, b in paired])
            table[f"{arm}/{task}"] = row
    return table


def _base_on(base: dict, run: dict) -> float:
    scores = {e["id"]: e["score"] for e in base["episodes"]}
    ids = [e["id"] for e in run["episodes"]]
    if any(i not in scores for i in ids):
        raise ValueError("a run evaluated items the base run did not: compare on the same held-out items")
    return sum(scores[i] for i in ids) / len(ids)


def write_report(out: dict, path: str) -> None:
    """<path>.md (tables) and <path>.png (success per release with 95% Clopper-Pearson intervals)."""
    table = summary(out)
    out["summary"] = table
    data_file(path).write_text(json.dumps(out, indent=1))
    lines = ["| run | task | success | 95% CI (Clopper-Pearson) | episodes with a valid call | tool calls (valid) | "
             "episodes ended by a server error | wall s |", "|---|---|---|---|---|---|---|---|"]
    for name, run in out["runs"].items():
        for task, ev in run.get("eval", {}).items():
            lines.append(f"| {name} | {task} | {ev['success']}/{ev['n']} ({ev['accuracy']:.2f}) | "
                         f"{ev['ci95'][0]:.2f}-{ev['ci95'][1]:.2f} | {ev['episodes_with_valid_calls']}/{ev['n']} | "
                         f"{ev['tool_calls']} ({ev['valid_calls']}) | {ev.get('server_errors', 0)} | {ev['wall_s']} |")
    means = ["| arm | task | seeds | base on the same items | release, mean over seeds | 95% t-interval (seeds) | "
             "all seeds' episodes (95% Clopper-Pearson) | gain over base | 95% t-interval | "
             "gain over SFT (same seed) | 95% t-interval |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ci = (lambda lo, hi: "n/a (one seed)" if math.isnan(lo) else f"{lo:+.3f} to {hi:+.3f}")
    for t in sorted(table.values(), key=lambda t: ("-vllm" in t["arm"], "-sft" not in t["arm"], t["arm"])):
        m, g, o = t["mean"], t["gain"], t.get("gain_over_sft")
        k, n = t["pooled"]
        lo, hi = clopper_pearson(k, n)
        means.append(f"| {t['arm']} | {t['task']} | {len(t['seeds'])} | "
                     f"{sum(t['base_on_seed_items']) / len(t['seeds']):.3f} | {m[0]:.3f} | {ci(m[1], m[2])} | "
                     f"{k}/{n} ({lo:.2f}-{hi:.2f}) | "
                     f"{g[0]:+.3f} | {ci(g[1], g[2])} | " + (f"{o[0]:+.3f} | {ci(o[1], o[2])} |" if o else "| |"))
    block = (f"{TABLES}\nCommand: `{out['command']}`\n\n" + "\n".join(means) + "\n\n" + "\n".join(lines)
             + f"\n{TABLES_END}")
    md = Path(f"{path}.md")
    text = md.read_text() if md.is_file() else f"# {Path(path).name}\n\n{TABLES}{TABLES_END}\n"
    head, _, rest = text.partition(TABLES)
    md.write_text(head + block + rest.partition(TABLES_END)[2])
    try:
        plt = pyplot()
    except ImportError:
        return
    tasks = [t for t in out["args"]["tasks"] if any(t in r.get("eval", {}) for r in out["runs"].values())]
    arms: dict[str, list[dict]] = {}  # per arm, its runs (the base is one run); bars: the mean over seeds
    for name, r in out["runs"].items():
        arms.setdefault("base" if name == "base" else arm_of(name), []).append(r)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        names = sorted((a for a, runs in arms.items() if all(task in r.get("eval", {}) for r in runs)),
                       key=lambda a: (a != "base", "-vllm" in a, "-sft" not in a, a))  # base, sft, policy
        x = list(range(len(names)))
        series = ((-0.2, "success", "task success", "tab:blue"),
                  (0.2, "episodes_with_valid_calls", "episodes with a valid call", "tab:orange"))
        for shift, key, label, color in series:
            per_arm = [[r["eval"][task][key] / r["eval"][task]["n"] for r in arms[a]] for a in names]
            stats = [t_interval(v) for v in per_arm]
            err = [[0 if math.isnan(lo) else m - max(lo, 0) for m, lo, _ in stats],
                   [0 if math.isnan(hi) else min(hi, 1) - m for m, _, hi in stats]]
            ax.bar([i + shift for i in x], [m for m, _, _ in stats], width=0.4, yerr=err, capsize=3, color=color,
                   alpha=0.75, label=label)
            for i, v in enumerate(per_arm):  # each seed
                ax.scatter([i + shift] * len(v), v, s=12, color="black", zorder=3)
        ax.set_xticks(x, [f"{a.removeprefix('tools-')}\n({len(arms[a])} run{'s' if len(arms[a]) > 1 else ''})"
                          for a in names], fontsize=7)
        ax.set_ylim(0, 1.05)
        n = arms[names[0]][0]["eval"][task]["n"]
        ax.set_title(f"{task}, {n} held-out items: mean over seeds, 95% t-interval, dots = seeds", fontsize=8)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(f"{path}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
