"""Where a GRPO step's memory goes: the real SmolLM2-135M (fp32, CPU) on 16 tool episodes, peak RSS per phase.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench/trainer_memory.py  # results/trainer-memory.{md,png}, data/*.json
    .venv/bin/python scripts/bench/trainer_memory.py --variants before after --steps 3 --out /tmp/tm

It exists because the GRPO stage of scripts/studies/learn_tool_task.py held 7.6 GB to train a 135M model on 16 episodes
(issue 38). Each variant (a set of TrainerConfig fields: `before` is the straightforward path, the vocabulary-wide
logits of whole micro-batches; `after` the trainer's defaults) runs in a child process of its own, one after
another, on the same 16 episodes: 4 calculator items (learn_tool_task.py's rollout items of seed 0) x 4 rollouts of
1-3 tool calls and a final answer, templated by the engine's own tool template (the tool schemas in the system
prompt: ~360 prompt tokens) and joined into one masked sample per episode as the learner joins them
(reef_lab.learning.episodes). The loss is GRPO's (DIS, group advantages; recipes/grpo/examples/tools.yaml: lr 5e-5,
micro-batches of 4). Peaks are the kernel's (VmHWM, reset per phase through /proc/self/clear_refs; Linux only):
  load      TorchTrainer(...) on the model folder (weights; the logit-path check);
  rollout   the rollout logprobs, no gradient (what the engine records in a live run; computed here);
  forward   one micro-batch: policy logprobs and the loss, graph kept (autograd's saved tensors counted);
  backward  that micro-batch's backward;
  step N    whole TorchTrainer.step calls (the first one creates AdamW's state), timed;
  idle      RSS after the steps, and after gc + glibc malloc_trim (what a learner holds between steps).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from scripts.common import ROOT, pyplot  # noqa: E402

BEFORE = "27f3034"  # main before issue 38's trainer-memory change: its reef_lab/ is unpacked and run as it was
VARIANTS = {  # name: (the reef_lab to run: a commit, or None for this checkout; TrainerConfig fields)
    "before": (BEFORE, {}),
    "full-logits": (None, {"logprob_chunk": 0}),
    "chunked": (None, {}),
    "checkpointed": (None, {"gradient_checkpointing": True}),
}
# A variant whose name starts with "serve-" holds the embedded engine too, as scripts/serve.py's process does: its
# base weights, one loaded release (another copy) routed to, and the KV caches of the 16 episodes' turns generated
# concurrently (--engine-tokens each, temperature 1) before the trainer loads.
VARIANTS |= {"serve-before": VARIANTS["before"], "serve-after": VARIANTS["checkpointed"]}
# glibc's default, dynamic mmap threshold (what TorchTrainer fixes at 128 KB: torch_trainer.fix_mmap_threshold):
# the threshold rises as large blocks are freed, and a step's tensors then come from heap arenas that keep their pages
ENV = {"checkpointed-dynamic-mmap": {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024)}}
VARIANTS["checkpointed-dynamic-mmap"] = VARIANTS["checkpointed"]


# ---- the kernel's view of this process -----------------------------------------------------------------------------
def _status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024  # kB -> MB
    raise KeyError(key)


def rss_mb() -> float:
    return _status("VmRSS")


def reset_peak() -> None:
    """Start a new high-water mark at the current RSS (Linux >= 4.0: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_mb() -> float:
    return _status("VmHWM")


# ---- the episodes ---------------------------------------------------------------------------------------------------
def tool_episodes(model_dir: Path, groups: int, group: int, seed: int):
    """groups x group episode Samples of calculator items: rollout j of a group makes 1 + j % 3 tool calls and
    answers; each turn templated by the engine's ChatTokenizer, the episode joined by the learner's own code."""
    import random

    from reef_lab.engines.remote import ChatTokenizer
    from reef_lab.learning.episodes import EpisodeConfig, samples_for_report
    try:
        from reef_lab.tasks.base import make_task
        from reef_lab.tasks.demos import turn_records
    except ModuleNotFoundError:  # the `before` variant runs an older tree, from before tasks left learning/
        from reef_lab.learning.tasks import make_task
        from reef_lab.learning.tool_demos import turn_records

    chat = ChatTokenizer.from_folder(model_dir)
    rng = random.Random(seed)
    items = make_task({"name": "calculator", "options": {"max_turns": 4}}).items(groups, 200 + seed)
    out = []
    for item in items:
        for j in range(group):
            transcript = []
            for k in range(1 + j % 3):
                a, b = rng.randrange(10 ** 6, 10 ** 9), rng.randrange(10 ** 6, 10 ** 9)
                name = ("add", "mul")[rng.randrange(2)]
                call_id = f"call_{item['id']}_{j}_{k}"
                transcript += [{"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function",
                                "function": {"name": name, "arguments": json.dumps({"a": a, "b": b})}}]},
                               {"role": "tool", "tool_call_id": call_id, "content": str(a + b if name == "add" else
                                                                                         a * b)}]
            transcript.append({"role": "assistant", "content": transcript[-1]["content"]})
            records = []
            for k, rec in enumerate(turn_records(chat, item, transcript, "memory", {"group": item["id"]})):
                records.append({**rec, "id": f"{item['id']}-{j}-{k}", "status": "ok", "episode": f"{item['id']}-{j}",
                                "created_at": float(k), "release_id": "base", "request": {"temperature": 1.0},
                                "logprobs": [0.0] * len(rec["token_ids"])})
            score = float(j % 2)
            out += samples_for_report({"id": f"report-{item['id']}-{j}", "score": score}, records, EpisodeConfig())
    return out


# ---- one variant, in its own process --------------------------------------------------------------------------------
class Phases:
    """Peak RSS per phase of whole TorchTrainer.step calls, with no change to the trainer: the model's forward
    pre-hook starts `forward`, Tensor.backward `backward`, the optimizer's step `optimizer`; at each change the
    kernel's high-water mark since the last change is the ending phase's (its largest over the step's micro-batches),
    and autograd's saved tensors (the graph a backward frees) are counted per micro-batch."""

    def __init__(self, torch, trainer):
        self.torch, self.current, self.peaks, self.saved, self.graph, self.trace = torch, "pack", {}, {}, [], []
        self.params = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
        trainer.model.get_decoder().register_forward_pre_hook(lambda module, args: self.enter("forward"))
        backward, step = torch.Tensor.backward, trainer.optimizer.step

        def wrapped_backward(tensor, *a, **k):
            self.enter("backward")
            backward(tensor, *a, **k)
            self.enter("pack")

        def wrapped_step(*a, **k):
            self.enter("optimizer")
            out = step(*a, **k)
            self.enter("after")
            return out
        torch.Tensor.backward, trainer.optimizer.step = wrapped_backward, wrapped_step

    def enter(self, name: str) -> None:
        if name == self.current:
            return
        self.peaks[self.current] = max(self.peaks.get(self.current, 0.0), peak_mb())
        self.trace.append([self.current, round(peak_mb()), round(rss_mb())])  # phase, its peak, RSS at its end
        if self.current == "forward":
            self.graph.append(sum(self.saved.values()) / 2 ** 20)
        if name == "forward":
            self.saved = {}
        self.current = name
        reset_peak()

    def pack(self, t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.params and self.current == "forward":
            self.saved[ptr] = t.untyped_storage().nbytes()
        return t

    def run(self, fn):
        self.peaks, self.graph, self.trace, self.current = {}, [], [], "pack"
        reset_peak()
        with self.torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
            out = fn()
        self.enter("done")
        return out


def serving_engine(args, samples):
    """The embedded engine on the model, with a release loaded and routed to, after generating one turn of
    --engine-tokens per episode, all at once, from each episode's whole sequence as the prompt."""
    from reef_lab.engines.base import ChatRequest, SamplingParams
    from reef_lab.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine.from_path(str(args.model_dir))
    engine.load_release("memory:v1", args.model_dir)
    engine.route("memory", "memory:v1")
    params = SamplingParams(max_tokens=args.engine_tokens, temperature=1.0, seed=0)
    streams = [engine.submit(ChatRequest([], params, scenario="memory", prompt_ids=s.prompt_ids + s.completion_ids))
               for s in samples]
    engine.generated = sum(len(st.result(timeout=3600).token_ids) for st in streams)
    return engine


def child(args) -> dict:
    import gc
    import resource

    import torch

    from reef_lab.learning import rl
    from reef_lab.trainers.base import Loss
    from reef_lab.trainers.torch_trainer import TorchTrainer, TrainerConfig

    import reef_lab

    torch.set_num_threads(args.threads)
    tree, overrides = VARIANTS[args.child]
    ran = Path(reef_lab.__file__).resolve().parents[1]
    if ran != (Path(args.tree).resolve() if args.tree else ROOT):
        raise RuntimeError(f"variant {args.child} imported reef_lab from {ran}, not from {args.tree or ROOT}")
    row: dict = {"variant": args.child, "tree": tree or "this checkout", "config": overrides, "phases": {}}
    top = [0.0]  # the process's peak: clear_refs resets the counter ru_maxrss reads too

    def phase(name: str, started: float, peaks: dict | None = None, **extra) -> None:
        peak = max(peaks.values()) if peaks else peak_mb()
        top[0] = max(top[0], peak)
        row["phases"][name] = {"peak_mb": round(peak, 1), "rss_mb": round(rss_mb(), 1),
                               "s": round(time.perf_counter() - started, 2), **extra}
        if peaks:
            row["phases"][name]["by_phase_mb"] = {k: round(v, 1) for k, v in peaks.items()}
        print(f"[{args.child}] {name}: peak {peak:.0f} MB, now {rss_mb():.0f} MB "
              f"{row['phases'][name].get('by_phase_mb', '')} {extra or ''}", file=sys.stderr, flush=True)
        reset_peak()

    samples = tool_episodes(args.model_dir, args.episodes // 4, 4, args.seed)
    row["episodes"] = {"n": len(samples), "prompt_tokens": [len(s.prompt_ids) for s in samples],
                       "completion_tokens": [len(s.completion_ids) for s in samples],
                       "trained_tokens": [s.trained_tokens for s in samples]}
    row["tokens_per_step"] = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    reset_peak()
    phase("start", time.perf_counter())
    if args.child.startswith("serve-"):
        engine = serving_engine(args, samples)  # noqa: F841 - held, as a server holds it, through the steps
        phase("engine", time.perf_counter(), tokens=engine.generated)
        # after the engine, as serve.py's learner starts: the trainer's peaks below add to what the engine holds
    t0 = time.perf_counter()
    cfg = TrainerConfig(lr=5e-5, micro_batch_size=args.micro_batch, device="cpu", **overrides)
    trainer = TorchTrainer(args.model_dir, cfg)
    phase("load", t0, params_mb=round(sum(p.numel() * p.element_size() for p in trainer.params) / 2 ** 20, 1))

    t0 = time.perf_counter()
    for s, lp in zip(samples, trainer.logprobs(samples), strict=True):
        s.logprobs = lp
    advs = rl.group_advantages([s.score for s in samples], [s.group for s in samples])
    for s, a in zip(samples, advs, strict=True):
        s.advantages = [a] * len(s.completion_ids)
        s.extra["advantages"] = s.advantages  # where the `before` variant's older tree reads them
    phase("rollout", t0)

    probe = Phases(torch, trainer)
    row["steps"] = []
    for k in range(args.steps):
        t0 = time.perf_counter()
        m = probe.run(lambda: trainer.step(samples, Loss("dis", 0.3, 5.0)))
        row["steps"].append({"loss": m["loss"], "grad_norm": m["grad_norm"], "step_s": m["step_s"],
                             "graph_mb": [round(g, 1) for g in probe.graph], "trace_mb": probe.trace})
        phase(f"step {k + 1}", t0, dict(probe.peaks), loss=m["loss"], grad_norm=m["grad_norm"],
              graph_mb=round(max(probe.graph), 1))
        gc.collect()
        row["steps"][-1]["held_mb"] = round(rss_mb(), 1)
    row["adamw_state_mb"] = round(sum(v.numel() * v.element_size() for st in trainer.optimizer.state.values()
                                      for v in st.values() if torch.is_tensor(v)) / 2 ** 20, 1)
    row["grads_held_mb"] = round(sum(p.grad.numel() * p.grad.element_size() for p in trainer.params
                                     if p.grad is not None) / 2 ** 20, 1)
    row["peak_mb"] = round(top[0], 1)
    row["held_mb"] = row["steps"][-1]["held_mb"]
    row["ru_maxrss_mb_unreliable"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(f"[{args.child}] peak {row['peak_mb']:.0f} MB, held after the last step {row['held_mb']:.0f} MB",
          file=sys.stderr, flush=True)
    return row


# ---- the parent: variants one at a time, the report -----------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--episodes", type=int, default=16, help="episodes per step (groups of 4)")
    ap.add_argument("--micro-batch", type=int, default=4, help="TrainerConfig.micro_batch_size (tools.yaml's 4)")
    ap.add_argument("--steps", type=int, default=3, help="whole optimizer steps timed per variant")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-tokens", type=int, default=64, help="serve-* variants: tokens generated per episode "
                    "(learn_tool_task.py's --max-tokens)")
    ap.add_argument("--model-dir", type=Path, default=None, help="default: the embedded SmolLM2 (converted cache)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "trainer-memory")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tree", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--render", action="store_true", help="only re-render <out>.md's tables and <out>.png from "
                    "<out>.json")
    args = ap.parse_args()
    if args.render:
        render(args.out)
        return
    if args.model_dir is None:
        from reef_lab.engines.embedded import DEFAULT_MODEL_NAME, default_cache_dir, load_model

        args.model_dir = default_cache_dir() / DEFAULT_MODEL_NAME
        if not (args.model_dir / "config.json").is_file():
            load_model(None, default_cache_dir())  # converts the GGUF once
    if args.child:
        print(json.dumps(child(args)))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="trainer-memory-") as tmp:
        for name in args.variants:
            tree, _ = VARIANTS[name]
            cmd = [sys.executable, __file__, "--child", name, "--episodes", str(args.episodes), "--micro-batch",
                   str(args.micro_batch), "--steps", str(args.steps), "--threads", str(args.threads), "--seed",
                   str(args.seed), "--model-dir", str(args.model_dir), "--engine-tokens", str(args.engine_tokens)]
            if tree:
                folder = Path(tmp) / tree
                if not folder.exists():
                    folder.mkdir()
                    archive = subprocess.run(["git", "-C", str(ROOT), "archive", tree, "reef_lab"], check=True,
                                             stdout=subprocess.PIPE).stdout
                    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
                cmd += ["--tree", str(folder)]
            # an old commit's reef_lab comes first on the child's path (the child checks where it came from)
            path = os.pathsep.join(x for x in (str(folder) if tree else "", os.environ.get("PYTHONPATH", "")) if x)
            done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True,
                                  env={**os.environ, "PYTHONPATH": path, **ENV.get(name, {})})
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    write_report(args, rows)


TABLES, TABLES_END = "<!-- tables: written by scripts/bench/trainer_memory.py -->", "<!-- /tables -->"


def write_report(args, rows: list[dict]) -> None:
    import torch
    import transformers

    from scripts.command_line import command_line, data_file

    command = command_line(program="HF_HUB_OFFLINE=1 .venv/bin/python")
    meta = {"command": command.strip(), "model_dir": str(args.model_dir), "episodes": args.episodes,
            "micro_batch": args.micro_batch, "steps": args.steps, "threads": args.threads,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "python": platform.python_version(), "cpu_count": os.cpu_count()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data_file(args.out).write_text(json.dumps({"meta": meta, "variants": rows}, indent=1))
    render(args.out)


def render(out: Path) -> None:
    """<out>.png and the tables of <out>.md (between the TABLES markers; the rest of the page is kept) from
    its JSON."""
    from scripts.command_line import data_file, data_link

    data = json.loads(data_file(out).read_text())
    meta, rows = data["meta"], data["variants"]
    ep = rows[0]["episodes"]

    def cfg(row):
        return f"`{row['tree']}`" if row["tree"] != "this checkout" else (
            ", ".join(f"`{k}: {v}`" for k, v in row["config"].items()) or "defaults")

    lines = [TABLES, "", f"Command: `{meta['command']}`", "",
             f"{ep['n']} episodes, prompts {min(ep['prompt_tokens'])}-{max(ep['prompt_tokens'])} tokens, completions "
             f"{min(ep['completion_tokens'])}-{max(ep['completion_tokens'])} ({sum(ep['trained_tokens'])} trained), "
             f"{rows[0]['tokens_per_step']} tokens per step; micro-batches of {meta['micro_batch']}; "
             f"{meta['threads']} threads; torch {meta['versions']['torch']}, transformers "
             f"{meta['versions']['transformers']}.", "",
             "| variant | code / settings | peak RSS MB | held after a step MB | graph per micro-batch MB | "
             "step s | step-1 loss | step-1 grad norm |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        first = r["steps"][0]
        times = " / ".join(f"{s['step_s']:.0f}" for s in r["steps"])
        lines.append(f"| {r['variant']} | {cfg(r)} | {r['peak_mb']:.0f} | {r['held_mb']:.0f} | "
                     f"{max(first['graph_mb']):.0f} | {times} | {first['loss']:.9f} | {first['grad_norm']:.6f} |")
    phases = [k for k in rows[0]["phases"] if k.startswith("step")][-1:]  # the last step: AdamW's state exists
    keys = ["pack", "forward", "backward", "optimizer", "after"]
    lines += ["", "Peak RSS (MB) by phase of the last step, the largest over its micro-batches (a phase's peak starts "
              "from the RSS it found: memory freed but not handed back counts on):", "",
              "| variant | load | rollout (no grad) | " + " | ".join(f"{p}: {k}" for p in phases for k in keys) + " |",
              "|---|---|---|" + "---|" * (len(phases) * len(keys))]
    for r in rows:
        ph = r["phases"]
        cells = [f"{ph[p]['by_phase_mb'].get(k, 0):.0f}" for p in phases for k in keys]
        lines.append(f"| {r['variant']} | {ph['load']['peak_mb']:.0f} | {ph['rollout']['peak_mb']:.0f} | "
                     + " | ".join(cells) + " |")
    lines += ["", f"AdamW state {rows[-1]['adamw_state_mb']:.0f} MB; trained weights "
              f"{rows[-1]['phases']['load']['params_mb']:.0f} MB. Raw numbers: `{data_link(out)}`; "
              f"figure: `{out.with_suffix('.png').name}`.", "", TABLES_END]
    block = "\n".join(lines)
    md = out.with_suffix(".md")
    text = md.read_text() if md.is_file() else f"# Trainer memory\n\n{TABLES}\n{TABLES_END}\n"
    head, rest = text.split(TABLES, 1)
    md.write_text(head + block + rest.split(TABLES_END, 1)[1])

    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["peak_mb"] / 1024 for r in rows], 0.4, label="peak during a step")
    ax.bar([x + 0.2 for x in xs], [r["held_mb"] / 1024 for r in rows], 0.4, label="held after a step")
    ax.axhline(3.0, color="k", ls="--", lw=1, label="target 3 GB (3072 MB)")
    ax.set_xticks(list(xs), [r["variant"] for r in rows])
    ax.set_ylabel("RSS (GB of 1024 MB)")
    ax.legend(fontsize=8)
    ax.set_title(f"GRPO step, {Path(meta['model_dir']).name} fp32, {ep['n']} tool episodes", fontsize=10)
    bx.bar(list(xs), [sum(s["step_s"] for s in r["steps"]) / len(r["steps"]) for r in rows], 0.5)
    bx.set_xticks(list(xs), [r["variant"] for r in rows])
    bx.set_ylabel("seconds per step (mean)")
    bx.set_title(f"CPU x{meta['threads']} (shared machine)")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(f"wrote {md} (+ .json, .png)", file=sys.stderr)


if __name__ == "__main__":
    main()
