"""On-policy distillation against SFT and GRPO on the calculator tool task, at equal episodes: a learning curve per arm.

Issue 41's tool-task comparison, run as a user would against `scripts/serve.py` (the embedded SmolLM2-135M), a
fresh server per arm and seed, each starting from the base weights; every episode goes through the OpenAI SDK's
tool loop (scripts/studies/learn_tool_task.py's), one session per episode:
- opd: the student samples `--per-release` calculator episodes (temperature 1) from the weights it serves, reports
  them on the episode (the score is only metadata), and the opd recipe scores each whole episode under the teacher
  on the student's own token ids (tool results masked) and takes one reverse-KL step: one release per round;
- opd-fkl (only when named in --arms): opd with the forward KL over the teacher's top 16 tokens at each position of
  the student's episode, a signal on tokens the student did not sample (the teacher's `<tool_call>` where the
  student wrote text), where the reverse KL sees only the sampled ones;
- sft: the teacher samples the same number of episodes of the same items (a records-only scenario of a server
  that serves the teacher); their inference records (the teacher's own token ids) are imported into the student's
  server and reported on the episode, and the sft recipe (score_threshold 0: every sampled episode, as in sequence-
  level distillation) takes one NLL step on them: one release per round;
- grpo: the student samples groups of 4 episodes per item, scored by the task's verifier; one GRPO step per round.
After each round the release runs the held-out episodes (calculator, items seed 1000, greedy) and a retention task
it is not trained on (colors), without reporting them. The teacher is a release folder (e.g. an SFT then GRPO
release of scripts/studies/learn_tool_task.py) and is scored on the same held-out episodes once.
Writes <out>.md, <out>.png and its JSON (every curve point; results/data/ for a page in results/); `--merge`
joins per-seed files.

    python scripts/studies/distill_tool_task.py --teacher runs/al/data/seed-1/grpo/data/releases/tools-grpo-s1/v2 \
        --seeds 0 --out runs/distill-tools/s0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import yaml

from reef_lab.records.record import CLIENT_FIELDS
from reef_lab.tasks.base import make_task
from reef_lab.testing import free_port
from scripts.common import ROOT, clopper_pearson, pyplot, t_interval
from scripts.command_line import command_line, data_file
from scripts.studies.learn_tool_task import (EVAL_SEED, _retrying, fresh_dir, merge_results,
                                             policy_rollouts, run_episodes, sdk_client, start_server, wait_releases)

ARMS = ("opd", "opd-fkl", "sft", "grpo")
CONFIGS = {"opd": "recipes/opd/examples/tools.yaml", "sft": "recipes/sft/examples/tools-episodes.yaml",
           "grpo": "recipes/grpo/examples/tools.yaml"}
VARIANTS = {"opd-fkl": ("opd", {"divergence": "forward_kl", "top_k": 16})}  # arm: (its recipe, config changes)
TABLES, TABLES_END = "<!-- tables: written by scripts/studies/distill_tool_task.py -->", "<!-- /tables -->"


def arm_config(arm: str, per_release: int, teacher: Path | None) -> dict:
    """The arm's recipe config, sized so one optimizer step on one round's `per_release` episodes makes a release."""
    recipe, changes = VARIANTS.get(arm, (arm, {}))
    rc = yaml.safe_load((ROOT / CONFIGS[recipe]).read_text())
    rc.update(batch_size=per_release, steps_per_candidate=1, selection="always", **changes)
    rc.pop("eval_task", None)
    if recipe == "opd":
        rc["teacher"] = {"model_path": str(teacher.resolve())}
    if arm == "grpo" and per_release % rc.get("group_size", 1):
        raise SystemExit(f"--per-release {per_release} must be a multiple of grpo's group_size {rc['group_size']}")
    return rc


def held_out(args) -> dict:
    """The held-out jobs of run_episodes: the trained tools' calculator and the retention task (colors)."""
    calc = make_task({"name": "calculator", "options": {"max_turns": args.max_turns}})
    colors = make_task({"name": "colors"})
    return {"calculator": (calc, calc.items(args.n, EVAL_SEED), args.max_tokens, args.max_turns),
            "colors": (colors, colors.items(args.n, EVAL_SEED), 12, 1)}


def point(episodes: int, ev: dict, release: str | None) -> dict:
    """A curve point: what the serving weights did on each held-out task (episodes kept for the record)."""
    return {"episodes": episodes, "release": release,
            **{name: {k: r[k] for k in ("success", "n", "accuracy", "ci95", "episodes_with_valid_calls")}
               for name, r in ev.items()},
            "transcripts": {name: [{k: e[k] for k in ("id", "score", "valid_calls", "invalid_calls", "transcript")}
                                   for e in r["episodes"]] for name, r in ev.items()}}


class Server:
    """scripts/serve.py as a child of this script, stopped on leaving the block."""

    def __init__(self, data: Path, recipe: str, config: dict | None, model_path: str | None, max_batch: int):
        data.mkdir(parents=True, exist_ok=True)
        self.data = data
        cfg = data / "recipe-config.yaml"
        cfg.write_text(yaml.safe_dump(config or {}, sort_keys=False))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = start_server(data, self.port, str(cfg.resolve()), max_batch, model_path, recipe=recipe)
        self.sdk = sdk_client("openai", self.url)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stop(120)


def records_scenario(url: str, name: str) -> None:
    """A records-only (`basic`) scenario; one an earlier run made in the same data dir is used as it is."""
    r = requests.post(f"{url}/reef/scenarios", json={"name": name, "recipe": "basic"}, timeout=60)
    if r.status_code != 409:
        r.raise_for_status()


def teacher_episodes(srv: Server, scenario: str, calc, items: list[dict], args) -> dict[str, list[dict]]:
    """The teacher samples one episode of each item (temperature `--temperature`), each its own session, reported
    with its score in a records-only scenario; returns each episode's inference records (the teacher's token ids),
    keyed by episode, in the order of `items`."""
    records_scenario(srv.url, scenario)
    if _retrying("GET", f"{srv.url}/reef/scenarios/{scenario}/records", params={"limit": 1}).json()["records"]:
        raise SystemExit(f"{scenario} in {srv.data} holds an earlier run's teacher episodes: remove that folder or "
                         "give another --data-dir")
    log = Path(args.data_dir) / "teacher" / f"{scenario}.jsonl"
    rows = policy_rollouts(srv.url, srv.sdk, scenario, calc, items, 1, args.max_tokens, args.max_turns,
                           args.temperature, args.concurrency, log)
    records, after = [], None
    while True:
        page = _retrying("GET", f"{srv.url}/reef/scenarios/{scenario}/records",
                         params={"kind": "inference", "limit": 500, **({"after": after} if after else {})}).json()
        records += page["records"]
        after = page.get("next")
        if not after:
            break
    by_episode: dict[str, list[dict]] = {}
    for r in records:
        by_episode.setdefault(r["episode"], []).append(r)
    scores = {}
    for r in rows:  # policy_rollouts keeps no session id: match an episode to its item by its records' tags
        scores.setdefault(r["item"], r.get("score"))
    out = {}
    for ep, recs in by_episode.items():
        item = recs[0]["tags"]["group"]
        out[ep] = {"item": item, "score": scores.get(item), "records": recs}
    order = {it["id"]: k for k, it in enumerate(items)}
    return dict(sorted(out.items(), key=lambda kv: order[kv[1]["item"]]))


def import_episodes(srv: Server, scenario: str, episodes: list[tuple[str, dict]]) -> None:
    """The teacher's episodes into the student's server: its inference records as sampled (token ids, turn order),
    then a report on each episode with the teacher's score, which the sft recipe trains on as one masked sample."""
    recs = [{**{k: r[k] for k in CLIENT_FIELDS if r.get(k) is not None and k not in ("release_id", "scenario")},
             "scenario": scenario} for _, ep in episodes for r in ep["records"]]
    _retrying("POST", f"{srv.url}/reef/records/batch", json={"records": recs}).raise_for_status()
    for ep_id, ep in episodes:
        _retrying("POST", f"{srv.url}/reef/report", json={"episode": ep_id, "score": ep["score"] or 0.0,
                                                         "metadata": {"item": ep["item"], "teacher": True}},
                  headers={"x-reef-scenario": scenario}).raise_for_status()


def run_arm(arm: str, seed: int, args, jobs: dict, teacher_srv: Server | None) -> dict:
    calc = jobs["calculator"][0]
    rounds = args.episodes // args.per_release
    rc = arm_config(arm, args.per_release, Path(args.teacher))
    group = rc.get("group_size", 1) if arm == "grpo" else 1
    per_round = args.per_release // group
    items = calc.items(rounds * per_round, 200 + seed)
    held = {it["expression"] for it in jobs["calculator"][1]}
    if held & {it["expression"] for it in items}:
        raise SystemExit("training items overlap the held-out ones")
    scenario = f"{arm}-s{seed}"
    data = fresh_dir(Path(args.data_dir) / f"seed-{seed}" / arm)
    run = {"arm": arm, "seed": seed, "recipe_config": rc, "rounds": []}
    teacher = None
    if arm == "sft":
        teacher = list(teacher_episodes(teacher_srv, f"teacher-samples-s{seed}", calc, items, args).items())
        run["teacher_success"] = sum(ep["score"] or 0 for _, ep in teacher) / len(teacher)
    started = time.perf_counter()
    recipe = VARIANTS.get(arm, (arm,))[0]
    with Server(data, recipe, rc, args.model_path, max(2 * args.n, args.concurrency)) as srv:
        for r in range(rounds):
            t0 = time.perf_counter()
            part = items[r * per_round:(r + 1) * per_round]
            if arm == "sft":
                import_episodes(srv, scenario, teacher[r * per_round:(r + 1) * per_round])
                sampled = [ep["score"] or 0.0 for _, ep in teacher[r * per_round:(r + 1) * per_round]]
            else:
                rows = policy_rollouts(srv.url, srv.sdk, scenario, calc, part, group, args.max_tokens,
                                       args.max_turns, args.temperature, args.concurrency, data / "rollouts.jsonl",
                                       first=r * args.per_release)
                sampled = [x["score"] for x in rows if "score" in x]
            rels = wait_releases(srv.url, scenario, r + 1, timeout=7200)
            ev = run_episodes(srv.url, srv.sdk, scenario, jobs, report=False)
            p = point((r + 1) * args.per_release, ev, rels["serving"])
            p.update(sampled_success=sum(sampled) / max(1, len(sampled)), round_s=round(time.perf_counter() - t0, 1))
            run["rounds"].append(p)
            print(f"[distill] {scenario} round {r + 1}/{rounds}: {rels['serving']} calculator "
                  f"{p['calculator']['success']}/{p['calculator']['n']}, colors {p['colors']['success']}/"
                  f"{p['colors']['n']} (sampled success {p['sampled_success']:.2f}, {p['round_s']:.0f} s)",
                  file=sys.stderr, flush=True)
        metrics = data / "learn" / scenario / "metrics.jsonl"
        steps = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
        run["steps"] = [{k: s.get(k) for k in ("loss", "reverse_kl", "teacher_gap", "reward_mean", "tokens",
                                                "grad_norm") if s.get(k) is not None}
                        for s in steps if s.get("event") == "step"]
    run["wall_s"] = round(time.perf_counter() - started, 1)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", help="the teacher: a model folder with the student's tokenizer (a release folder)")
    ap.add_argument("--model-path", default=None, help="the student (default: the embedded SmolLM2-135M-Instruct; "
                                                       "tiny: the tests' random model, a smoke run)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=["opd", "sft", "grpo"])
    ap.add_argument("--episodes", type=int, default=64, help="sampled episodes per arm and seed (the budget)")
    ap.add_argument("--per-release", type=int, default=16, help="episodes per optimizer step (= per release)")
    ap.add_argument("--n", type=int, default=20, help="held-out items per task (calculator, colors)")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each calculator reply")
    ap.add_argument("--max-turns", type=int, default=4, help="model replies per calculator episode")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of training episodes")
    ap.add_argument("--concurrency", type=int, default=16, help="episodes in flight")
    ap.add_argument("--no-reference", action="store_true", help="skip the base and teacher held-out runs")
    ap.add_argument("--data-dir", default="runs/distill-tools", help="the servers' data dirs, one per arm and seed")
    ap.add_argument("--out", default="results/distill-tools")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="run nothing: join these result files into <out>")
    args = ap.parse_args()
    if args.merge:
        out = merge_results(args.merge)
        out["reference"] = next((r for f in args.merge if (r := json.loads(Path(f).read_text()).get("reference"))),
                                None)  # the base and the teacher, from the run that scored them
        save(out, args.out)
        return
    if not args.teacher or not (Path(args.teacher) / "config.json").is_file():
        raise SystemExit("--teacher must be a model folder (config.json, weights, tokenizer): e.g. a release folder "
                         "of scripts/studies/learn_tool_task.py's SFT then GRPO stage")
    if args.episodes % args.per_release:
        raise SystemExit(f"--episodes {args.episodes} must be a multiple of --per-release {args.per_release}")
    jobs = held_out(args)
    out = {"command": command_line(), "args": vars(args), "runs": {}, "reference": None}
    teacher_srv = None
    if "sft" in args.arms or not args.no_reference:
        teacher_srv = Server(Path(args.data_dir) / "teacher", "basic", None, args.teacher,
                             max(2 * args.n, args.concurrency))
    try:
        if not args.no_reference:
            records_scenario(teacher_srv.url, "teacher")
            ref = {"teacher": point(0, run_episodes(teacher_srv.url, teacher_srv.sdk, "teacher", jobs,
                                                    report=False), None)}
            with Server(Path(args.data_dir) / "base", "basic", None, args.model_path, 2 * args.n) as base:
                records_scenario(base.url, "base")
                ref["base"] = point(0, run_episodes(base.url, base.sdk, "base", jobs, report=False), "base")
            out["reference"] = ref
            save(out, args.out)
        for seed in args.seeds:
            for arm in args.arms:
                out["runs"][f"{arm}-s{seed}"] = run_arm(arm, seed, args, jobs, teacher_srv)
                save(out, args.out)
    finally:
        if teacher_srv is not None:
            teacher_srv.__exit__()
    save(out, args.out)


# ---- the page ------------------------------------------------------------------------------------------------------
def curves(out: dict, task: str) -> dict[str, list[tuple[int, float, float, float, int]]]:
    """Per arm: (episodes, mean, low, high, seeds) of held-out accuracy on `task` over seeds, the base at 0."""
    base = (out.get("reference") or {}).get("base")
    res = {}
    for arm in ARMS:
        runs = [r for r in out["runs"].values() if r["arm"] == arm]
        if not runs:
            continue
        pts = [(0, base[task]["accuracy"], base[task]["accuracy"], base[task]["accuracy"], len(runs))] if base else []
        for k in range(min(len(r["rounds"]) for r in runs)):
            xs = [r["rounds"][k][task]["accuracy"] for r in runs]
            m, lo, hi = t_interval(xs)
            pts.append((runs[0]["rounds"][k]["episodes"], m, lo, hi, len(xs)))
        res[arm] = pts
    return res


def save(out: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    data_file(path).write_text(json.dumps(out, indent=1))
    write_report(out, path)


def _cell(m: float, lo: float, hi: float, n: int) -> str:
    """An accuracy and its t-interval over seeds, the interval clipped to [0, 1] (where an accuracy can be)."""
    return f"{m:.3f}" + ("" if n < 2 else f" ({max(0.0, lo):.2f} to {min(1.0, hi):.2f})")


def write_report(out: dict, path: str) -> None:
    ref = out.get("reference") or {}
    seeds = ", ".join(f"{a} {n}" for a, n in _seeds(out).items())
    lines = [TABLES, "", f"Command: `{out['command']}`", "", f"Seeds per arm: {seeds}. Held-out: "
             f"{out['args']['n']} calculator episodes (greedy) and {out['args']['n']} colors items (retention, never "
             "trained); mean over seeds with a 95% t-interval (clipped to 0-1).", ""]
    for name, r in ref.items():
        c = r["calculator"]
        lo, hi = clopper_pearson(c["success"], c["n"])
        lines.append(f"- {name}: calculator {c['success']}/{c['n']} ({lo:.2f}-{hi:.2f}), colors "
                     f"{r['colors']['success']}/{r['colors']['n']}")
    for task in ("calculator", "colors"):
        cur = curves(out, task)
        if not cur:
            continue
        xs = sorted({p[0] for pts in cur.values() for p in pts})
        lines += ["", f"**{task}** ({'the trained task' if task == 'calculator' else 'retention'}), held-out "
                  "accuracy after N sampled episodes:", "", "| arm | " + " | ".join(str(x) for x in xs) + " |",
                  "|---|" + "---|" * len(xs)]
        for arm, pts in cur.items():
            by = {p[0]: p for p in pts}
            lines.append(f"| {arm} | " + " | ".join(_cell(*by[x][1:]) if x in by else "" for x in xs) + " |")
    steps = {a: [r for r in out["runs"].values() if r["arm"] == a] for a in ARMS}
    walls = [f"{a} {sum(r['wall_s'] for r in rs) / len(rs) / 60:.0f} min" for a, rs in steps.items() if rs]
    lines += ["", f"Wall per seed (2 CPU cores, servers included): {', '.join(walls)}.", "", TABLES_END]
    md = Path(f"{path}.md")
    text = md.read_text() if md.is_file() else f"# OPD vs SFT vs GRPO on the calculator tool task\n\n{TABLES}\n" \
        f"{TABLES_END}\n"
    head, _, rest = text.partition(TABLES)
    _, _, tail = rest.partition(TABLES_END)
    md.write_text(head + "\n".join(lines) + tail)
    try:
        plt = pyplot()
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, task in zip(axes, ("calculator", "colors")):
        for arm, pts in curves(out, task).items():
            x = [p[0] for p in pts]
            ax.plot(x, [p[1] for p in pts], marker="o", label=arm)
            if all(p[4] >= 2 for p in pts):
                ax.fill_between(x, [p[2] for p in pts], [p[3] for p in pts], alpha=0.15)
        if "teacher" in ref:
            ax.axhline(ref["teacher"][task]["accuracy"], color="grey", ls="--", label="teacher")
        ax.set_title(f"{task} ({'trained' if task == 'calculator' else 'retention'})")
        ax.set_xlabel("sampled episodes")
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.legend()
    fig.tight_layout()
    fig.savefig(f"{path}.png", dpi=110)
    plt.close(fig)


def _seeds(out: dict) -> dict[str, int]:
    return {a: n for a in ARMS if (n := sum(1 for r in out["runs"].values() if r["arm"] == a))}


if __name__ == "__main__":
    main()
