"""TTT-Discover against best-of-N sampling from the base policy, at the same number of samples (same model, prompts
and verifier), over several seeds; beside them the problem's best known value and a classical optimiser (scipy
SLSQP multistart) given each TTT run's wall time. Writes results/<name>.{md,png}, results/data/<name>.json.

    python scripts/studies/compare_tttd.py recipes/tttd/examples/circle_packing_cpu.yaml --seeds 0 1 2
    python scripts/studies/compare_tttd.py recipes/tttd/examples/circle_centres_cpu.yaml --arms ttt search best_of_n \
        --results results/tttd-circle-centres

Each arm is an ordinary experiment of recipes/tttd, run in <out>/<arm>-seed<N>; a finished run is not run again, so
the command resumes. One engine serves every run. Arms: `ttt` (the recipe), `best_of_n` (`policy_updates: false,
reuse: false`: every sample from the base policy on the initial state), and `search` (`policy_updates: false`: the
PUCT archive search with the base policy, no training; what the training adds is ttt minus search).
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import time
from pathlib import Path


import orjson  # noqa: E402
import yaml  # noqa: E402

from recipes.tttd.experiment import TTTDExperimentConfig, run_tttd_experiment  # noqa: E402
from recipes.tttd.problems import BEST_KNOWN, make_problem, scipy_baseline  # noqa: E402
from scripts.common import mean_ci, pyplot  # noqa: E402
from scripts.command_line import command_line, data_file  # noqa: E402

ARMS = {"ttt": {}, "search": {"policy_updates": False}, "best_of_n": {"policy_updates": False, "reuse": False}}
LABELS = {"ttt": "TTT-Discover", "search": "PUCT search, base policy (no training)",
          "best_of_n": "best-of-N from the base policy"}
COLOURS = {"ttt": "tab:blue", "search": "tab:purple", "best_of_n": "tab:orange"}


def curve(run_dir: Path, name: str) -> list[dict]:
    path = run_dir / "data" / "learn" / name / "metrics.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def edits(run_dir: Path, name: str, problem, last_steps: int = 2) -> dict:
    """What the last steps' samples did with their parent, read back from the run's records and re-verified: valid
    copies of the parent, valid new solutions, and new ones scoring above their parent (the discoveries)."""
    import polars as pl

    from reef_lab.records.segments import scan_records

    archive = orjson.loads((run_dir / "data" / "learn" / name / "archive.json").read_bytes())
    states = archive["states"].values() if isinstance(archive["states"], dict) else archive["states"]
    parents = {s["id"]: (s["solution"].strip(), s["reward"]) for s in states}
    rows = scan_records(run_dir / "data").filter(pl.col("kind") == "inference").select("tags", "response").collect()
    steps = [int(orjson.loads(t)["tttd_step"]) for t in rows["tags"]]
    first = max(steps) - last_steps + 1
    out = {"samples": 0, "valid": 0, "copies": 0, "new": 0, "better": 0}
    for tags, response, step in zip(rows["tags"], rows["response"], steps, strict=True):
        if step < first:
            continue
        out["samples"] += 1
        text = (orjson.loads(response)["choices"][0]["message"]["content"] or "") if response else ""
        verdict = problem.verify(text)
        if not verdict.valid:
            continue
        out["valid"] += 1
        parent = parents.get(orjson.loads(tags)["parent"])
        if parent is not None and verdict.solution.strip() == parent[0]:
            out["copies"] += 1
        else:
            out["new"] += 1
            out["better"] += parent is not None and verdict.reward > parent[1] + 1e-12
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a recipes/tttd experiment YAML")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=["ttt", "best_of_n"],
                   help="which arms to run (ttt is needed: scipy gets its wall time)")
    p.add_argument("--out", default="runs/tttd-compare", help="folder of the runs")
    p.add_argument("--results", default="results/tttd-circle-packing", help="results/<name> (md, json, png)")
    p.add_argument("--scipy-cap", type=float, default=60.0,
                   help="most seconds scipy gets (it meets the best known value long before a TTT run's wall time)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field of both arms (e.g. steps=10)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    base = yaml.safe_load(Path(args.config).read_text())
    for item in args.set:
        k, _, v = item.partition("=")
        base.setdefault("config", {})[k] = yaml.safe_load(v)
    if "ttt" not in args.arms:
        p.error("--arms must include ttt (the classical optimiser gets each TTT run's wall time)")
    problem = make_problem(TTTDExperimentConfig(**base).recipe_config().problem)
    out = Path(args.out)
    engine, runs = None, {arm: {} for arm in args.arms}
    started = time.time()
    for seed in args.seeds:
        for arm in args.arms:
            extra = ARMS[arm]
            run_dir = out / f"{arm}-seed{seed}"
            name = f"{arm.replace('_', '-')}-s{seed}"
            if not (run_dir / "summary.json").is_file():
                cfg = TTTDExperimentConfig(**{**base, "name": name, "seed": seed, "out_dir": str(run_dir),
                                              "config": {**base.get("config", {}), **extra}})
                if engine is None:
                    engine = build_engine(cfg)
                print(f"[compare] {arm} seed {seed} -> {run_dir}", flush=True)
                run_tttd_experiment(cfg, engine=engine, progress=True, close_engine=False)
            runs[arm][seed] = {"summary": orjson.loads((run_dir / "summary.json").read_bytes()),
                               "curve": curve(run_dir, name), "edits": edits(run_dir, name, problem)}
    if engine is not None:
        engine.close()
    cfg = TTTDExperimentConfig(**base).recipe_config()
    n = cfg.problem_config.n
    for seed in args.seeds:  # the classical optimiser, given the TTT run's wall time (capped: see --scipy-cap)
        wall = runs["ttt"][seed]["summary"]["wall_s"]
        res = scipy_baseline(n, seconds=min(wall, args.scipy_cap), seed=seed)
        runs.setdefault("scipy", {})[seed] = {"best": res.best, "starts": res.starts, "seconds": round(res.seconds, 1),
                                              "ttt_wall_s": wall}
    write(args, base, cfg, runs, time.time() - started)


def build_engine(cfg: TTTDExperimentConfig):
    from reef_lab.config import ServeConfig
    from reef_lab.engines import engine_class
    from reef_lab.experiments.driver import choose_engine

    name = cfg.engine
    if name == "auto":
        name, why = choose_engine(cfg.model_path, cfg.recipe_config().trainer.lora_rank > 0)
        print(f"[compare] engine {name} ({why})", flush=True)
    opts = orjson.dumps(cfg.engine_options).decode() if cfg.engine_options else None
    return engine_class(name).from_config(ServeConfig(engine=name, model_path=cfg.model_path,
                                                      max_batch=cfg.recipe_config().concurrency,
                                                      engine_options=opts))


def problem_title(cfg) -> str:
    pc = cfg.problem_config
    how = {"circle_packing": "the model writes a program printing x y r",
           "circle_centres": "the model places the centres, radii by LP"}[pc.name]
    return f"circle packing (n = {pc.n}; {how})"


def write(args, base: dict, cfg, runs: dict, seconds: float) -> None:
    plt = pyplot()
    seeds = args.seeds
    n, per_step = cfg.problem_config.n, cfg.groups * cfg.rollouts_per_group
    best_known = BEST_KNOWN.get(n, (None, ""))
    stats = {}
    arms = args.arms
    for arm in arms:
        finals = [runs[arm][s]["summary"]["best_reward"] for s in seeds]
        stats[arm] = {"final": mean_ci(finals), "finals": finals,
                      "valid": [statistics.fmean(r["valid_fraction"] for r in runs[arm][s]["curve"]) for s in seeds],
                      # what the policy samples at the end (mean reward of the last two steps, invalid = 0)
                      "late_mean": [statistics.fmean(r["mean_reward"] for r in runs[arm][s]["curve"][-2:])
                                    for s in seeds],
                      "wall": [runs[arm][s]["summary"]["wall_s"] for s in seeds]}
    scipy_best = [runs["scipy"][s]["best"] for s in seeds]
    stats["scipy"] = {"final": mean_ci(scipy_best), "finals": scipy_best,
                      "wall": [runs["scipy"][s]["seconds"] for s in seeds]}

    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for arm in arms:
        colour = COLOURS[arm]
        steps = min(len(runs[arm][s]["curve"]) for s in seeds)
        xs = [(k + 1) * per_step for k in range(steps)]
        for key, axis in (("best_reward", ax[0]), ("mean_reward", ax[1])):
            ys = [[runs[arm][s]["curve"][k][key] for s in seeds] for k in range(steps)]
            m = [statistics.fmean(y) for y in ys]
            h = [mean_ci(y)[1] if len(y) > 1 else 0 for y in ys]
            axis.plot(xs, m, color=colour, label=LABELS[arm])
            axis.fill_between(xs, [a - b for a, b in zip(m, h)], [a + b for a, b in zip(m, h)], color=colour,
                              alpha=0.2)
    if best_known[0]:
        ax[0].axhline(best_known[0], color="black", ls="--", lw=1, label=f"best known {best_known[0]:.4f}")
    ax[0].axhline(stats["scipy"]["final"][0], color="tab:green", ls=":", lw=1.5,
                  label=f"scipy SLSQP, same wall time ({stats['scipy']['final'][0]:.4f})")
    ax[0].set(xlabel="samples", ylabel="best sum of radii so far", title=f"{problem_title(cfg)}")
    start = runs["ttt"][seeds[0]]["summary"].get("initial_reward")
    if start is not None:
        ax[0].axhline(start, color="grey", lw=1, label=f"start {start:.4f}")
    ax[1].set(xlabel="samples", ylabel="mean reward of the step's samples (invalid = 0)",
              title="what each step samples (mean ± 95% CI over seeds)")
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=9)
    fig.tight_layout()
    png = Path(args.results + ".png")
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)

    def fmt(arm):
        m, h = stats[arm]["final"]
        return f"{m:.4f} ± {h:.4f}" if not math.isnan(h) else f"{m:.4f}"

    def valid(arm):
        return f"{statistics.fmean(stats[arm]['valid']):.3f}" if "valid" in stats[arm] else "-"

    def late(arm):
        if "late_mean" not in stats[arm]:
            return "-"
        m, h = mean_ci(stats[arm]["late_mean"])
        return f"{m:.3f} ± {h:.3f}" if not math.isnan(h) else f"{m:.3f}"
    rows = "\n".join(
        f"| {label} | {fmt(arm)} | {', '.join(f'{x:.4f}' for x in stats[arm]['finals'])} | "
        f"{valid(arm)} | "
        f"{late(arm)} | {statistics.fmean(stats[arm]['wall']) / 60:.1f} |"
        for arm, label in [*((a, LABELS[a]) for a in arms),
                           ("scipy", f"scipy SLSQP multistart, each TTT run's wall time (cap {args.scipy_cap:g} s)")])
    cmd = command_line(["scripts/studies/compare_tttd.py", args.config, "--seeds", *map(str, seeds), "--arms", *arms,
                        "--scipy-cap", f"{args.scipy_cap:g}", "--out", args.out, "--results", args.results,
                        *(w for s in args.set for w in ("--set", s))])
    md = f"""# TTT-Discover on {problem_title(cfg)}, CPU

Command: `{cmd}` (written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {seconds / 60:.0f} min in all).
Config: [{args.config}](../{args.config}) with {cfg.steps} steps of {cfg.groups} x {cfg.rollouts_per_group} = {per_step}
samples ({cfg.steps * per_step} per run), temperature {cfg.temperature}, max_tokens {cfg.max_tokens}, LoRA rank
{cfg.trainer.lora_rank}, lr {cfg.trainer.lr}, KL coefficient {cfg.kl_coef}; engine `{base.get('engine', 'auto')}`.
Best-of-N is the same experiment with `policy_updates: false, reuse: false`: every sample from the base policy on the
initial solution's prompt, same count, same verifier; PUCT search (if run) is `policy_updates: false`: the archive
search of TTT-Discover with the base policy, so TTT-Discover minus search is what the training adds. Best known value: {best_known[0]} ({best_known[1]}).

![best so far and mean reward per step]({png.name})

Final best sum of radii, mean ± 95% t-interval over {len(seeds)} seeds:

| arm | best (mean ± CI) | per seed | valid fraction | mean reward, last 2 steps (± CI) | wall min |
|---|---|---|---|---|---|
{rows}
"""
    pairs = [(a, b) for a, b in (("ttt", "best_of_n"), ("ttt", "search"), ("search", "best_of_n"))
             if a in arms and b in arms]
    diff_rows = []
    for a, b in pairs:
        cells = []
        for key in ("finals", "late_mean"):
            d = [x - y for x, y in zip(stats[a][key], stats[b][key], strict=True)]
            m, h = mean_ci(d)
            cells.append(f"{m:+.3f} ± {h:.3f}" + (" (CI excludes 0)" if not math.isnan(h) and abs(m) > h else ""))
        stats.setdefault("paired", {})[f"{a}-{b}"] = cells
        diff_rows.append(f"| {LABELS[a]} minus {LABELS[b]} | {cells[0]} | {cells[1]} |")
    if diff_rows:
        diff_table = "\n".join(diff_rows)
        md += f"""
Paired by seed (same seed: same first step, same sampling seeds), mean ± 95% t-interval of the differences:

| comparison | best found | mean reward, last 2 steps |
|---|---|---|
{diff_table}
"""
    edit_rows = "\n".join(
        f"| {LABELS[arm]} | {sum(runs[arm][x]['edits']['samples'] for x in seeds)} | "
        + " | ".join(str(sum(runs[arm][x]['edits'][k] for x in seeds)) for k in ("valid", "copies", "new", "better"))
        + " |" for arm in arms)
    md += f"""
What the samples of the last two steps did with their parent (all seeds; read back from the records and verified
again): valid replies, valid copies of the parent's solution, valid new solutions, and new ones scoring above their
parent.

| arm | samples | valid | copies of the parent | new | better than the parent |
|---|---|---|---|---|---|
{edit_rows}
"""
    Path(args.results + ".md").write_text(md)
    data_file(args.results).write_bytes(orjson.dumps({"config": base, "seeds": seeds, "stats": stats,
                                                           "runs": runs}, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    print(md)


if __name__ == "__main__":
    main()
