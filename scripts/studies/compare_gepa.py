"""reef_lab's GEPA against the reference implementation (`gepa.optimize`, pip `gepa`) on the same task, models,
splits, seed harness and metric-call budget; writes results/gepa-<task>.md and .png, results/data/gepa-<task>.json.

    pip install -c constraints-cpu.txt -e '.[bench]'      # gepa==0.1.4
    python scripts/studies/compare_gepa.py recipes/gepa/examples/arithmetic.yaml --seeds 0 1 2

Both searches run in this process on one embedded engine, alternating per seed, and score candidates with the same
`TaskSystem` (greedy task answers behind the harness, the task's verifier and its feedback text). The reference gets
an adapter over that system and the same reflection model with the same sampling; its own reflection prompt,
Pareto selection, round-robin component choice and merge are used as shipped. What each reports: the seed harness's
and the best (by validation mean) harness's score on the held-out test split, and the metric calls it used.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import yaml  # noqa: E402

from recipes.gepa.experiment import GEPAExperimentConfig, make_splits, run_gepa_experiment, score_on  # noqa: E402
from recipes.gepa.search import TaskSystem  # noqa: E402
from reef_lab.engines.lm import make_lm  # noqa: E402
from reef_lab.tasks.base import make_task  # noqa: E402
from scripts.common import mean_ci, pyplot  # noqa: E402
from scripts.command_line import command_line, data_file  # noqa: E402


class ReferenceAdapter:
    """gepa.GEPAAdapter over reef_lab's TaskSystem: the same rollouts, scores and feedback text."""

    propose_new_texts = None  # use gepa's own reflection prompt and parsing

    def __init__(self, system: TaskSystem):
        self.system = system

    def evaluate(self, batch, candidate, capture_traces=False):
        from gepa.core.adapter import EvaluationBatch

        rollouts = self.system.run(candidate, batch)
        return EvaluationBatch(outputs=[r.output for r in rollouts], scores=[r.score for r in rollouts],
                               trajectories=rollouts if capture_traces else None)

    def make_reflective_dataset(self, candidate, eval_batch, components_to_update):
        rows = [{"Inputs": r.question, "Generated Outputs": r.output, "Feedback": r.feedback}
                for r in eval_batch.trajectories]
        return {c: rows for c in components_to_update}


def run_reference(cfg: GEPAExperimentConfig, engine, progress: bool) -> dict:
    import gepa

    task = make_task({"system_prompt": "", **cfg.task})
    train, val, test = make_splits(task, cfg.train_size, cfg.val_size, cfg.test_size, cfg.data_seed)
    system = TaskSystem(make_lm(cfg.task_lm, engine), cfg.task_max_tokens, cfg.concurrency)
    sc = cfg.search_config()
    lm = make_lm(cfg.reflection_lm, engine)
    calls = {"n": 0}

    def reflection_lm(prompt: str) -> str:
        calls["n"] += 1
        return lm.complete([{"role": "user", "content": prompt}], max_tokens=sc.reflection_max_tokens,
                           temperature=sc.reflection_temperature, seed=cfg.seed * 100_003 + calls["n"])

    started = time.time()
    result = gepa.optimize(
        seed_candidate=dict(cfg.seed_harness), trainset=train, valset=val, adapter=ReferenceAdapter(system),
        reflection_lm=reflection_lm, candidate_selection_strategy="pareto", module_selector="round_robin",
        reflection_minibatch_size=sc.minibatch_size, use_merge=sc.use_merge, max_merge_invocations=sc.max_merges,
        max_metric_calls=sc.max_metric_calls, skip_perfect_score=sc.skip_perfect, perfect_score=sc.perfect_score,
        seed=cfg.seed, display_progress_bar=progress, raise_on_exception=False)
    best = result.best_candidate
    seed_test, _ = score_on(system, dict(cfg.seed_harness), test)
    best_test, _ = score_on(system, best, test)
    return {"seed": cfg.seed, "metric_calls": result.total_metric_calls, "candidates": len(result.candidates),
            "seed_val": result.val_aggregate_scores[0], "best_val": result.val_aggregate_scores[result.best_idx],
            "seed_test": seed_test, "best_test": best_test, "best_harness": best, "reflections": calls["n"],
            "wall_s": round(time.time() - started, 1)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a GEPA experiment YAML (recipes/gepa/examples/*.yaml)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field")
    p.add_argument("--runs", default="runs/compare-gepa", help="folder of the runs")
    p.add_argument("--out", default=None, help="results stem (default results/gepa-<task name>)")
    p.add_argument("--report-only", action="store_true",
                   help="write the results page from the seeds finished so far (<runs>/rows.json), run nothing")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from scripts.run_experiment import apply_override

    data = yaml.safe_load(Path(args.config).read_text()) or {}
    for item in args.set:
        key, _, value = item.partition("=")
        apply_override(data, key, yaml.safe_load(value))
    base = GEPAExperimentConfig(**data)
    runs = Path(args.runs)
    stem = Path(args.out or f"results/gepa-{base.task.get('name', 'task')}")
    if args.report_only:
        rows = json.loads((runs / "rows.json").read_text())
        args.seeds = [r["seed"] for r in rows["reference"]]
        rows["reef_lab"] = [r for r in rows["reef_lab"] if r["seed"] in args.seeds]  # seeds both finished
        write_report(stem, base, rows, args)
        return
    from reef_lab.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine.from_path(base.model_path, max_batch=max(base.concurrency, 1))
    rows = {"reef_lab": [], "reference": []}
    try:
        for seed in args.seeds:
            cfg = GEPAExperimentConfig(**{**data, "seed": seed, "out_dir": str(runs / f"reef-seed{seed}")})
            print(f"seed {seed}: reef_lab", flush=True)
            s = run_gepa_experiment(cfg, engine=engine)
            rows["reef_lab"].append({k: s[k] for k in ("seed", "metric_calls", "candidates", "seed_val", "best_val",
                                                       "seed_test", "best_test", "best_harness", "wall_s")})
            print(f"seed {seed}: reference gepa.optimize", flush=True)
            rows["reference"].append(run_reference(cfg, engine, progress=True))
            Path(runs).mkdir(parents=True, exist_ok=True)
            (runs / "rows.json").write_text(json.dumps(rows, indent=2))
    finally:
        engine.close()
    write_report(stem, base, rows, args)


def write_report(stem: Path, cfg: GEPAExperimentConfig, rows: dict, args) -> None:
    import importlib.metadata as md

    stem.parent.mkdir(parents=True, exist_ok=True)
    data_file(stem).write_text(json.dumps({"config": cfg.__dict__, "rows": rows}, indent=2, default=str))
    task = cfg.name.removeprefix("gepa-") if cfg.name else cfg.task.get("name")
    lines = [f"# GEPA on `{task}`: reef_lab vs reference `gepa.optimize` {md.version('gepa')}", "",
             "Command: `" + command_line(["scripts/studies/compare_gepa.py", args.config, "--seeds", *map(str, args.seeds),
                                          *(w for x in args.set for w in ("--set", x))]) + "`", "",
             f"Task model and reflection model: the embedded engine ({cfg.model_path or 'SmolLM2-135M-Instruct'}), "
             f"task answers greedy with max_tokens {cfg.task_max_tokens}, reflection sampled at temperature "
             f"{cfg.search_config().reflection_temperature} with max_tokens "
             f"{cfg.search_config().reflection_max_tokens}. Task {cfg.task}; splits train {cfg.train_size}, "
             f"validation {cfg.val_size}, test {cfg.test_size} (data seed {cfg.data_seed}, disjoint by question). "
             f"Budget {cfg.search_config().max_metric_calls} metric calls, minibatch "
             f"{cfg.search_config().minibatch_size}, merge {cfg.search_config().use_merge}. Seed harness: "
             f"`{json.dumps(cfg.seed_harness)}`.", "",
             "| system | seed | metric calls | candidates | val seed → best | test seed → best |",
             "|---|---|---|---|---|---|"]
    for name, rs in rows.items():
        for r in rs:
            lines.append(f"| {name} | {r['seed']} | {r['metric_calls']} | {r['candidates']} | "
                         f"{r['seed_val']:.3f} → {r['best_val']:.3f} | {r['seed_test']:.3f} → {r['best_test']:.3f} |")
    lines += ["", "| system | test score of the best harness (mean ± 95% t-interval over seeds) | gain over the seed harness |",
              "|---|---|---|"]
    summary = {}
    for name, rs in rows.items():
        m, ci = mean_ci([r["best_test"] for r in rs])
        g, gci = mean_ci([r["best_test"] - r["seed_test"] for r in rs])
        summary[name] = m
        lines.append(f"| {name} | {m:.3f} ± {ci:.3f} | {g:+.3f} ± {gci:.3f} |")
    verdict = summary["reef_lab"] >= summary["reference"]
    lines += ["", f"reef_lab's mean test score is {'at least' if verdict else 'below'} the reference's "
              f"({summary['reef_lab']:.3f} vs {summary['reference']:.3f}) at the same metric-call budget.", "",
              "Best harness found per run:", ""]
    for name, rs in rows.items():
        for r in rs:
            lines.append(f"- {name}, seed {r['seed']}: `{json.dumps(r['best_harness'])[:400]}`")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(stem, rows)
    print("\n".join(lines))


def plot(stem: Path, rows: dict) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for k, (name, rs) in enumerate(rows.items()):
        xs = [k * 3 + i * 0.25 for i in range(len(rs))]
        ax.scatter(xs, [r["seed_test"] for r in rs], marker="o", facecolors="none", edgecolors=f"C{k}",
                   label=f"{name} seed harness")
        ax.scatter(xs, [r["best_test"] for r in rs], marker="^", color=f"C{k}", label=f"{name} best harness")
    ax.set_xticks([0.25, 3.25], list(rows))
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()
