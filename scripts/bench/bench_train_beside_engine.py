"""Training beside the engine (issue 28): does a training step get the CPUs while a vLLM server on the same machine
serves traffic, and how soon does the live SAO loop release, against the embedded engine?

    .venv/bin/python scripts/bench/bench_train_beside_engine.py                       # both parts, arms interleaved
    .venv/bin/python scripts/bench/bench_train_beside_engine.py --part steps --rounds 3
    .venv/bin/python scripts/bench/bench_train_beside_engine.py --part release --arms embedded,vllm,vllm-nopause

Part `steps` (a): in one process, SAO's training round (value model, then the policy step; recipes/sao with the
live config and LoRA) on a fixed batch of 16 rollouts, while 16 client threads keep asking one engine, the arms
alternating step by step: `embedded` (the model in this process, as in serve.py), `vllm` (the vLLM server, paused
for the step by VLLMEngine.training_step, as the learner does) and `vllm-nopause` (the server left generating: how it
ran before). Part `release` (b): the live command, `serve.py --recipe sao` and `scripts/live_client.py` with 16 SDK
clients asking and reporting, once per arm, interleaved: the time from the first question to the first release,
and the learner's step times. Both record how many other sessions were using the CPUs meanwhile (Linux shares CPU
time between sessions, "autogroups", so that count sets what a run gets on a shared machine); results are ratios
to `embedded` within a round. Writes results/train-beside-vllm.{md,png}, results/data/train-beside-vllm.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import yaml

from reef_lab import procs
from reef_lab.testing import free_port
from scripts.common import ROOT, pyplot, quantile, wait_answering
from scripts.command_line import command_line, data_file, shell_words

SCENARIO = "arithmetic-live"  # live_client.py's default
ARMS = {"embedded": ("embedded", None), "vllm": ("vllm", True), "vllm-nopause": ("vllm", False)}


def recipe_config() -> dict:
    """recipes/sao/examples/live.yaml with LoRA (rank 8, lr 2e-4), which vLLM's in-place weight reload needs."""
    cfg = yaml.safe_load((ROOT / "recipes/sao/examples/live.yaml").read_text())
    cfg["trainer"] = {**cfg.get("trainer", {}), "lora_rank": 8, "lr": 2.0e-4}
    return cfg


class Contention:
    """Samples, every `period` s, how many sessions (autogroups) outside this benchmark have a runnable thread."""

    def __init__(self, period: float = 2.0):
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            mine = {os.getpid(), *(pid for pid, _ in procs.below(os.getpid()))}
            groups = set()
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) in mine:
                    continue
                try:
                    group = Path(f"/proc/{name}/autogroup").read_text().split()[:1]
                    states = [Path(f"/proc/{name}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
                              for t in os.listdir(f"/proc/{name}/task")]
                except OSError:
                    continue
                if group and "R" in states:
                    groups.add(group[0])
            self.samples.append(len(groups))

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join()
        return round(statistics.mean(self.samples), 1) if self.samples else None


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) used so far by `root` and every process below it."""
    total = 0
    for pid in [root, *(p for p, _ in procs.below(root))]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


# ---- part steps: one training round at a time beside each engine ------------------------------------------------
def part_steps(arms: list[str], rounds: int, clients: int) -> list[dict]:
    from dataclasses import replace

    from reef_lab.engines.base import ChatRequest, SamplingParams
    from reef_lab.engines.embedded import EmbeddedEngine
    from reef_lab.engines.vllm import VLLMEngine
    from reef_lab.learning.recipe import load_recipe
    from reef_lab.trainers.samples import Sample
    from reef_lab.tasks.base import make_task

    embedded = EmbeddedEngine.from_path(None, max_batch=16)
    engines = {"embedded": embedded}
    if any(ARMS[a][0] == "vllm" for a in arms):
        engines["vllm"] = VLLMEngine(embedded.model_dir, port=free_port())
    recipe = load_recipe("sao", {**recipe_config(), "critic_warmup_steps": 0})
    trainer = recipe.make_trainer(embedded.model_dir, None)
    items = make_task({"operators": ["+", "-"], "min_digits": 1, "max_digits": 2}).items(512, seed=0)
    gens = [embedded.submit(ChatRequest(it["messages"], SamplingParams(max_tokens=32, temperature=1.0))).result()
            for it in items[:16]]
    batch = [Sample(record_id=f"s{i}", prompt_ids=g.prompt_token_ids, completion_ids=g.token_ids,
                    logprobs=g.logprobs, score=float(i % 2), release_id="base") for i, g in enumerate(gens)]
    recipe.train(trainer, [replace(s, extra={}) for s in batch])  # warm: first-call costs out of the timings

    def ask(engine, stop: threading.Event, k: int, errors: list) -> None:
        while not stop.is_set():
            it = items[k % len(items)]
            k += clients
            try:
                engine.submit(ChatRequest(it["messages"], SamplingParams(max_tokens=32, temperature=1.0))).result(600)
            except Exception as e:  # noqa: BLE001 - counted: a failed answer is a finding
                errors.append(repr(e))
    out = []
    for k in range(rounds):
        for arm in arms:
            engine = engines[ARMS[arm][0]]
            stop, errors = threading.Event(), []
            load = [threading.Thread(target=ask, args=(engine, stop, i, errors)) for i in range(clients)]
            [t.start() for t in load]
            time.sleep(5)  # the engine is generating for every client
            pause = engine.training_step() if ARMS[arm][1] else nullcontext()
            server = engine._process.pid if ARMS[arm][0] == "vllm" else None  # the vLLM server's tree
            seen = Contention(1.0)
            started, own0 = time.perf_counter(), time.process_time()
            server0 = tree_cpu_s(server) if server else None
            with pause:
                m = recipe.train(trainer, [replace(s, extra={}) for s in batch])
            wall = time.perf_counter() - started
            own = (time.process_time() - own0) / wall  # the trainer (and the embedded engine, in this process)
            server_cpu = (tree_cpu_s(server) - server0) / wall if server else None
            others = seen.stop()
            stop.set()
            [t.join() for t in load]
            out.append({"arm": arm, "round": k, "train_s": round(wall, 2), "policy_step_s": m["step_s"],
                        "this_process_cpus": round(own, 2),
                        "vllm_server_cpus": None if server_cpu is None else round(server_cpu, 2),
                        "other_sessions": others, "errors": len(errors)})
            print(f"[bench] steps round {k} {arm}: {json.dumps(out[-1])}", file=sys.stderr, flush=True)
    for engine in engines.values():
        engine.close()
    return out


# ---- part release: the live command, time to the first release --------------------------------------------------
def serve_cmd(arm: str, port: int, data_dir: Path, cfg: Path) -> list[str]:
    engine, pause = ARMS[arm]
    cmd = [sys.executable, "scripts/serve.py", "--engine", engine, "--port", str(port), "--data-dir", str(data_dir),
           "--recipe", "sao", "--recipe-config", str(cfg), "--log-level", "warning"]
    if pause is not None:
        cmd += ["--engine-options", json.dumps({"port": free_port(), "pause_for_training": pause})]
    return cmd


def metrics(data_dir: Path) -> list[dict]:
    path = data_dir / "learn" / SCENARIO / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def inference_records(data_dir: Path) -> dict:
    """Answers of the live scenario: how many, how many failed, and their time in the gateway (s)."""
    import polars as pl

    from reef_lab.records.store import scan_records

    df = scan_records(data_dir).filter((pl.col("scenario") == SCENARIO) & (pl.col("kind") == "inference")) \
        .select("status", "timing").collect()
    ms = sorted(json.loads(t or "{}").get("total_ms", 0.0) for t in df["timing"].to_list())

    def pct(q: float) -> float | None:
        return round(quantile(ms, q) / 1e3, 2) if ms else None
    return {"answers": df.height, "failed": int((df["status"] != "ok").sum()), "latency_p50_s": pct(0.5),
            "latency_p95_s": pct(0.95), "latency_max_s": pct(1.0)}


def run_live(arm: str, k: int, work: Path, cfg: Path, clients: int, rollouts: int, timeout: float) -> dict:
    folder = work / f"{arm}-{k}"
    folder.mkdir(parents=True)
    port, data_dir = free_port(), folder / "data"
    url = f"http://127.0.0.1:{port}"
    cmd = serve_cmd(arm, port, data_dir, cfg)
    log = folder / "serve.log"
    started = time.time()
    server = procs.Popen(cmd, cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    client, seen = None, None
    try:
        wait_answering(url, server, log)
        ready_s = time.time() - started
        t0, seen = time.time(), Contention()
        client_cmd = [sys.executable, "scripts/live_client.py", "--url", url, "--rollouts", str(rollouts),
                      "--concurrency", str(clients), "--wait", "0"]
        client = procs.Popen(client_cmd, cwd=ROOT, stdout=open(folder / "client.log", "wb"),
                             stderr=subprocess.STDOUT)
        release = None
        while release is None and time.time() - t0 < timeout:
            release = next((r for r in metrics(data_dir) if r["event"] == "release"), None)
            if client.poll() not in (None, 0):
                raise RuntimeError(f"live_client exited with {client.returncode}: "
                                   f"{(folder / 'client.log').read_text()[-3000:]}")
            time.sleep(1)
        others = seen.stop()
        client_rc = client.wait(1800)  # every question asked and reported (its exit code says none failed)
        rows = metrics(data_dir)
    finally:
        if client is not None:
            client.stop(10)
        server.stop(60)
    steps = [r for r in rows if r["event"] == "step" and (release is None or r["time"] <= release["time"])]
    policy = [r for r in steps if r.get("phase") == "policy"]
    return {
        "arm": arm, "round": k, "command": command_line(cmd[1:]), "ready_s": round(ready_s, 1),
        "first_release_s": round(release["time"] - t0, 1) if release else None,
        "release": release and {x: release.get(x) for x in ("release_id", "accuracy", "swap_s")},
        "train_s": [r["train_s"] for r in steps], "policy_step_s": [r["step_s"] for r in policy],
        "train_s_mean": mean([r["train_s"] for r in steps]), "policy_step_s_mean": mean([r["step_s"] for r in policy]),
        "client_exit_code": client_rc, "other_sessions": others, **inference_records(data_dir)}


# ---- report -----------------------------------------------------------------------------------------------------
def mean(xs: list) -> float | None:
    return round(statistics.mean(xs), 2) if xs else None


def median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 2) if xs else None


def ratios(rows: list[dict], arm: str, keys: tuple[str, ...], base: str = "embedded") -> dict:
    """Per round, arm / base, for each key."""
    out = {}
    for key in keys:
        pairs = [(a[key], b[key]) for a in rows if a["arm"] == arm for b in rows
                 if b["arm"] == base and b["round"] == a["round"] and a[key] and b[key]]
        out[key] = [round(x / y, 2) for x, y in pairs]
    return out


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    panels = []
    if result.get("steps"):
        panels += [(result["steps"], "train_s", "(a) training round beside the engine, s"),
                   (result["steps"], "policy_step_s", "(a) policy step, s")]
    if result.get("release"):
        panels += [(result["release"], "first_release_s", "(b) live: first question to first release, s")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 4), squeeze=False)
    for ax, (rows, key, title) in zip(axes[0], panels, strict=True):
        arms = list(dict.fromkeys(r["arm"] for r in rows))
        for i, arm in enumerate(arms):
            vals = [r[key] for r in rows if r["arm"] == arm and r[key] is not None]
            ax.scatter([i] * len(vals), vals, alpha=0.7)
            if vals:
                ax.hlines(statistics.median(vals), i - 0.3, i + 0.3, color="k")
        ax.set_xticks(range(len(arms)), arms)
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=10)
    fig.suptitle("Training beside the engine, 2 shared CPUs, 16 clients (dots: runs; bars: medians)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(result: dict, path: Path) -> None:
    lines = ["# Training beside the engine: vLLM against the embedded engine (issue 28)", "",
             f"Commands (from {result['started']}, {result['wall_s'] / 60:.0f} min in all, on {result['cpus']} CPUs "
             "shared with other engineers' test runs):", "",
             *[f"    .venv/bin/python scripts/bench/{c}" for c in result["commands"]], "",
             f"Recipe config (recipes/sao/examples/live.yaml with LoRA, which vLLM's weight reload needs): "
             f"`{json.dumps(result['recipe_config'])}`. 'other sessions': the mean number of sessions outside the "
             "benchmark with a runnable thread while it measured (Linux shares CPU time between sessions, so with "
             "n of them busy a run gets about 1/(n+1) of the machine).", ""]
    verdict = []
    if result.get("steps"):
        rows = result["steps"]
        lines += ["## (a) A training round beside each engine, 16 clients asking it", "",
                  "One SAO round (value model twice, then the policy step) on a fixed batch of 16 rollouts, in one "
                  "process, the arms alternating round by round.", "",
                  "CPUs used during the round (CPU seconds / wall seconds): 'this process' is the trainer (with the "
                  "embedded engine's generation in the `embedded` arm), 'vLLM server' its whole process tree.", "",
                  "| round | arm | training round s | policy step s | CPUs: this process | CPUs: vLLM server | "
                  "other sessions | failed answers |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['round']} | {r['arm']} | {r['train_s']} | {r['policy_step_s']} | "
                  f"{r.get('this_process_cpus')} | {r.get('vllm_server_cpus')} | {r['other_sessions']} | "
                  f"{r['errors']} |" for r in rows]
        lines += ["", "| arm | training round / embedded's, per round | policy step / embedded's | median |",
                  "|---|---|---|---|"]
        for arm, rat in result["ratios"]["steps"].items():
            med = median(rat["policy_step_s"])
            lines += [f"| {arm} | {rat['train_s']} | {rat['policy_step_s']} | {median(rat['train_s'])} / {med} |"]
            if med is not None:
                verdict += [f"- (a) `{arm}`: the policy step takes {med}x as long as beside the embedded engine "
                            f"(goal: at most 1.5x): {'met' if med <= 1.5 else 'NOT met'}."]
        lines += [""]
    if result.get("release"):
        rows = result["release"]
        lines += ["## (b) The live command: first question to first release", "",
                  f"`serve.py --recipe sao`, then `scripts/live_client.py` with {result['clients']} SDK clients asking "
                  f"and reporting {result['rollouts']} questions (the first release needs 96 reports, 6 rounds and "
                  "the candidate's 64 held-out answers). The serve commands:", ""]
        for arm in dict.fromkeys(r["arm"] for r in rows):
            lines += [f"- `{arm}`: `{next(r['command'] for r in rows if r['arm'] == arm)}`"]
        lines += ["", "| round | arm | ready s | first release s | training round s (mean) | policy step s (mean) | "
                  "answers | failed | client exit | answer latency p50 / p95 / max s | other sessions |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['round']} | {r['arm']} | {r['ready_s']} | {r['first_release_s']} | {r['train_s_mean']} | "
                  f"{r['policy_step_s_mean']} | {r['answers']} | {r['failed']} | {r['client_exit_code']} | "
                  f"{r['latency_p50_s']} / {r['latency_p95_s']} / {r['latency_max_s']} | {r['other_sessions']} |"
                  for r in rows]
        lines += ["", "| arm | first release / embedded's, per round | median |", "|---|---|---|"]
        for arm, rat in result["ratios"]["release"].items():
            med = median(rat["first_release_s"])
            lines += [f"| {arm} | {rat['first_release_s']} | {med} |"]
            if med is not None:
                verdict += [f"- (b) `{arm}`: the first release comes after {med}x the embedded engine's time "
                            f"(goal: at most 1x): {'met' if med <= 1.0 else 'NOT met'}."]
            else:
                verdict += [f"- (b) `{arm}`: no run of it released within the limit ({result.get('timeout')} s) with "
                            "an embedded run beside it to compare: the goal is not decided by this run."]
        lines += [""]
    if result.get("notes"):
        lines += ["## Reading the numbers", "", *result["notes"], ""]
    lines += ["## Against the goal", "", "Issue 28: step time beside vLLM within 1.5x of beside the embedded engine; "
              "time to first release no worse than embedded. Medians over rounds:", "", *verdict, "",
              "![runs](train-beside-vllm.png)"]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("both", "steps", "release"), default="both")
    p.add_argument("--arms", default="embedded,vllm,vllm-nopause", help=f"comma-separated, of {sorted(ARMS)}")
    p.add_argument("--rounds", type=int, default=2, help="part steps: training rounds per arm")
    p.add_argument("--repeats", type=int, default=1, help="part release: live runs per arm")
    p.add_argument("--release-arms", default="embedded,vllm", help="part release: its arms")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rollouts", type=int, default=128, help="part release: questions per run")
    p.add_argument("--timeout", type=float, default=2400, help="part release: most seconds to the first release")
    p.add_argument("--work", default=str(ROOT / "runs" / "bench-train-beside"), help="part release: run folders")
    p.add_argument("--out", default=str(ROOT / "results" / "train-beside-vllm"), help="results path, no suffix")
    p.add_argument("--from-json", nargs="+", help="only render the page and the plot from these result files (one "
                   "per part: their parts are merged)")
    p.add_argument("--notes", help="a markdown file whose text goes on the page (and into the json) under 'Reading "
                   "the numbers': what the tables do not say by themselves")
    args = p.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        parts = [json.loads(Path(f).read_text()) for f in args.from_json]
        result = {k: v for part in parts for k, v in part.items()}
        result["commands"] = [c for part in parts for c in part["commands"]]
        result["ratios"] = {k: v for part in parts for k, v in part["ratios"].items()}
        result["wall_s"], result["started"] = sum(x["wall_s"] for x in parts), parts[0]["started"]
        if args.notes:
            result["notes"] = Path(args.notes).read_text().strip().splitlines()
            data_file(out).write_text(json.dumps(result, indent=2) + "\n")
    else:
        arms, release_arms = args.arms.split(","), args.release_arms.split(",")
        if unknown := set(arms + release_arms) - set(ARMS):
            raise SystemExit(f"unknown arms {sorted(unknown)}; choose from {sorted(ARMS)}")
        if "embedded" not in arms or "embedded" not in release_arms:
            raise SystemExit("the arms need `embedded`: the results are ratios to it")
        began = time.time()
        command = " ".join([Path(sys.argv[0]).name, shell_words(sys.argv[1:])]).strip()  # the page adds the folder
        result = {"commands": [command], "cpus": os.cpu_count(),
                  "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(began)),
                  "recipe_config": recipe_config(), "clients": args.clients, "rollouts": args.rollouts,
                  "timeout": args.timeout,
                  "ratios": {}}
        if args.part in ("both", "steps"):
            result["steps"] = part_steps(arms, args.rounds, args.clients)
            result["ratios"]["steps"] = {a: ratios(result["steps"], a, ("train_s", "policy_step_s"))
                                         for a in arms if a != "embedded"}
        if args.part in ("both", "release"):
            work = Path(args.work) / time.strftime("%Y%m%d-%H%M%S")
            work.mkdir(parents=True)
            cfg = work / "sao-live-lora.yaml"
            cfg.write_text(yaml.safe_dump(recipe_config()))
            result["release"] = []
            for k in range(args.repeats):
                for arm in release_arms:
                    print(f"[bench] release round {k}: {arm}", file=sys.stderr, flush=True)
                    result["release"].append(run_live(arm, k, work, cfg, args.clients, args.rollouts, args.timeout))
                    print(f"[bench]   {json.dumps(result['release'][-1])[:400]}", file=sys.stderr, flush=True)
            result["ratios"]["release"] = {a: ratios(result["release"], a, ("first_release_s", "policy_step_s_mean"))
                                           for a in release_arms if a != "embedded"}
        result["wall_s"] = round(time.time() - began)
        data_file(out).write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    report(result, out.with_suffix(".md"))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
