"""Training speed per token: reef_lab's in-process TorchTrainer vs TRL's GRPOTrainer, same model, data and CPU.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench/bench_trainer.py  # results/trainer-vs-trl.{md,png}, data/*.json
    .venv/bin/python scripts/bench/bench_trainer.py --rounds 7 --batch 16 --completion-len 32 --micro-batch 8

It exists to test the claim "the reef_lab trainer is at least as fast per token as TRL's GRPOTrainer". Needs TRL:
`pip install trl==1.16.0 -c constraints-cpu.txt`. A random-init tiny Llama (SmolLM2's tokenizer, read from the
reef_lab model cache) is saved to a temp folder and both trainers load it (fp32, CPU, 2 threads).
TRL generates ONE batch of completions with its own `_generate_and_score_completions` (untimed); the same
prompt/completion ids, stripped of TRL's padding, become reef_lab Samples with TRL's advantages (GRPO loss:
`reef_lab.trainers.losses.dis_token_loss`). Then, in alternating order per round, each side does `--steps` optimizer
steps on that batch and is timed around the update only (forward + backward over micro-batches + clip + AdamW):
  TRL:     trainer.training_step(model, chunk, n) per micro-batch, _clip_grad_norm, optimizer.step(),
           lr_scheduler.step(), model.zero_grad()   -- GRPO's generating `_prepare_inputs` is bypassed (identity).
  reef_lab: TorchTrainer.step(samples, dis_token_loss(0.3, 5.0)).
Tokens per step = real (unpadded) prompt + completion tokens of the batch, the same count for both sides.
Beside each side's speed: the process's peak RSS during that side's steps (the kernel's high-water mark, reset
before them: scripts/bench/trainer_memory.py; Linux) and how far it rose above the RSS the side started from. Both
trainers live in one process, so the peak includes the other side's model and optimizer state; the rise is the
side's own working memory (activations, logits, gradients, memory its allocator did not hand back).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from scripts.common import ROOT, pyplot  # noqa: E402
from scripts.command_line import command_line, data_file, data_link  # noqa: E402
from scripts.bench.trainer_memory import peak_mb, reset_peak, rss_mb  # noqa: E402

TOPICS = ["a lighthouse keeper", "a coral reef", "a lost robot", "a mountain village", "a deep-sea diver",
          "an old library", "a desert caravan", "a city at night", "a clockmaker", "a migrating whale",
          "a small bakery", "a space station", "a forest fire", "a chess champion", "a river delta", "a storm"]


def distinct_chars(completions, **kwargs) -> list[float]:
    """A cheap deterministic reward: how many distinct characters the completion uses (varies within a group)."""
    return [float(len(set(c[-1]["content"] if isinstance(c, list) else c))) for c in completions]


def build_model(folder: Path, tok_dir: Path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(tok_dir)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return tok, sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per side (plus one warm-up round)")
    ap.add_argument("--batch", type=int, default=16, help="sequences per optimizer step")
    ap.add_argument("--completion-len", type=int, default=32, help="max completion tokens TRL generates")
    ap.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward (both sides)")
    ap.add_argument("--group", type=int, default=4, help="GRPO group size (TRL num_generations)")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps per side per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "trainer-vs-trl")
    args = ap.parse_args()
    if args.batch % args.micro_batch or args.batch % args.group:
        sys.exit("--batch must be a multiple of --micro-batch and --group")
    torch.set_num_threads(args.threads)

    import datasets
    import transformers
    import trl
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import split_tensor_dict

    from reef_lab.trainers.losses import dis_token_loss
    from reef_lab.trainers.samples import Sample
    from reef_lab.trainers.torch_trainer import TorchTrainer, TrainerConfig

    tok_dir = Path.home() / ".cache" / "reef_lab" / "models" / "SmolLM2-135M-Instruct"
    if not (tok_dir / "tokenizer.json").exists():
        from reef_lab.engines.embedded import default_cache_dir, load_model
        load_model(None, default_cache_dir())
    tmp = tempfile.TemporaryDirectory(prefix="bench-trainer-")
    model_dir = Path(tmp.name)
    tok, n_params = build_model(model_dir, tok_dir)
    ga = args.batch // args.micro_batch
    print(f"model: random-init Llama, {n_params / 1e6:.2f}M params (vocab {len(tok)}); batch {args.batch} = "
          f"{ga} x {args.micro_batch}; threads {torch.get_num_threads()}", flush=True)

    # --- TRL: its own trainer, and one generated batch (untimed) ---
    prompts = [[{"role": "user", "content": f"Write a short story about {t}."}] for t in TOPICS]
    dataset = datasets.Dataset.from_dict({"prompt": prompts})
    cfg = GRPOConfig(output_dir=str(model_dir / "trl-out"), per_device_train_batch_size=args.micro_batch,
                     gradient_accumulation_steps=ga, num_generations=args.group,
                     max_completion_length=args.completion_len, learning_rate=1e-5, beta=0.0, bf16=False,
                     use_cpu=True, report_to=[], logging_steps=10**6, save_strategy="no", seed=0,
                     max_grad_norm=1.0, model_init_kwargs={"dtype": torch.float32})
    torch.manual_seed(0)
    trl_trainer = GRPOTrainer(model=str(model_dir), reward_funcs=distinct_chars, args=cfg, train_dataset=dataset,
                              processing_class=tok)
    model = trl_trainer.model
    assert next(model.parameters()).dtype == torch.float32 and next(model.parameters()).device.type == "cpu"
    trl_trainer.create_optimizer_and_scheduler(num_training_steps=(args.rounds + 1) * args.steps)
    trl_trainer.current_gradient_accumulation_steps = ga
    rows = [{"prompt": prompts[(i // args.group) % len(prompts)]} for i in range(args.batch)]
    model.train()
    t0 = time.perf_counter()
    gen = trl_trainer._generate_and_score_completions(rows)
    gen_s = time.perf_counter() - t0
    chunks = split_tensor_dict(gen, ga)
    trl_trainer._prepare_inputs = lambda inputs: inputs  # the batch is already generated: skip GRPO's generation

    # --- the same sequences as reef_lab Samples ---
    samples = []
    for i in range(args.batch):
        p = gen["prompt_ids"][i][gen["prompt_mask"][i].bool()].tolist()
        c = gen["completion_ids"][i][gen["completion_mask"][i].bool()].tolist()
        adv = float(gen["advantages"][i])
        samples.append(Sample(record_id=f"r{i}", prompt_ids=p, completion_ids=c, logprobs=None, score=adv,
                              release_id="base", group=f"g{i // args.group}", advantages=[adv] * len(c)))
    torch.manual_seed(0)
    reef = TorchTrainer(model_dir, TrainerConfig(lr=1e-5, micro_batch_size=args.micro_batch, device="cpu"),
                        init_folder=None, tokenizer=tok)
    for s, lp in zip(samples, reef.logprobs(samples), strict=True):
        s.logprobs = lp
    loss_fn = dis_token_loss(0.3, 5.0)
    p_tok = sum(len(s.prompt_ids) for s in samples)
    c_tok = sum(len(s.completion_ids) for s in samples)
    tokens = p_tok + c_tok
    padded = gen["prompt_ids"].shape[1] + gen["completion_ids"].shape[1]
    print(f"generated with TRL in {gen_s:.1f}s: {p_tok} prompt + {c_tok} completion tokens per step "
          f"(TRL pads every sequence to {padded})", flush=True)

    last: dict = {}  # sanity: the last step's loss and pre-clip gradient norm on each side

    def trl_step() -> None:
        loss = sum(float(trl_trainer.training_step(model, chunk, gen["num_items_in_batch"])) for chunk in chunks)
        last["trl"] = {"loss": loss, "grad_norm": float(trl_trainer._clip_grad_norm(model))}
        trl_trainer.optimizer.step()
        trl_trainer.lr_scheduler.step()
        model.zero_grad()

    def reef_step() -> None:
        m = reef.step_fn(samples, loss_fn)
        last["reef_lab"] = {"loss": m["loss"], "grad_norm": m["grad_norm"]}

    sides = {"trl": trl_step, "reef_lab": reef_step}
    results: list[dict] = []
    for r in range(args.rounds + 1):
        order = ["trl", "reef_lab"] if r % 2 else ["reef_lab", "trl"]
        row = {"round": r, "warmup": r == 0, "first": order[0]}
        for name in order:
            start_mb = rss_mb()
            reset_peak()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                sides[name]()
            dt = time.perf_counter() - t0
            row[f"{name}_s_per_step"] = dt / args.steps
            row[f"{name}_tok_s"] = tokens * args.steps / dt
            row[f"{name}_peak_rss_mb"] = peak_mb()
            row[f"{name}_rise_mb"] = row[f"{name}_peak_rss_mb"] - start_mb
        row["ratio"] = row["reef_lab_tok_s"] / row["trl_tok_s"]
        results.append(row)
        print(f"round {r}{' (warm-up, discarded)' if r == 0 else ''}: reef_lab {row['reef_lab_tok_s']:.0f} tok/s, "
              f"peak RSS {row['reef_lab_peak_rss_mb']:.0f} MB (+{row['reef_lab_rise_mb']:.0f}); "
              f"TRL {row['trl_tok_s']:.0f} tok/s, peak RSS {row['trl_peak_rss_mb']:.0f} MB "
              f"(+{row['trl_rise_mb']:.0f}); ratio {row['ratio']:.3f} (first: {order[0]})", flush=True)

    timed = [row for row in results if not row["warmup"]]

    def summary(key: str) -> dict:
        xs = [row[key] for row in timed]
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}

    summ = {k: summary(k) for k in ("reef_lab_tok_s", "trl_tok_s", "ratio", "reef_lab_s_per_step", "trl_s_per_step",
                                    "reef_lab_peak_rss_mb", "trl_peak_rss_mb", "reef_lab_rise_mb", "trl_rise_mb")}
    ratio_of_medians = summ["reef_lab_tok_s"]["median"] / summ["trl_tok_s"]["median"]
    verdict = "holds" if summ["ratio"]["median"] >= 1.0 else "does NOT hold"
    command = command_line(program="HF_HUB_OFFLINE=1 .venv/bin/python")
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                "python": platform.python_version(), "cpu_count": os.cpu_count(), "threads": args.threads}
    meta = {"command": command.strip(), "params": n_params, "vocab": len(tok), "batch": args.batch,
            "micro_batch": args.micro_batch, "grad_accum": ga, "group": args.group, "steps_per_round": args.steps,
            "completion_len": args.completion_len, "prompt_tokens": p_tok, "completion_tokens": c_tok,
            "tokens_per_step": tokens, "trl_padded_width": padded, "generation_s": gen_s, "versions": versions}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data_file(args.out).write_text(json.dumps({"meta": meta, "rounds": results, "summary": summ,
                                                         "ratio_of_medians": ratio_of_medians,
                                                         "last_step": last}, indent=2))

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [row["round"] for row in timed]
    ax.plot(xs, [row["reef_lab_tok_s"] for row in timed], "o-", label="reef_lab TorchTrainer.step")
    ax.plot(xs, [row["trl_tok_s"] for row in timed], "s-", label="TRL GRPOTrainer training_step + optimizer")
    ax.set_xlabel("round")
    ax.set_ylabel("tokens/s (prompt + completion)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"update speed, {n_params / 1e6:.1f}M-param Llama, batch {args.batch}, CPU x{args.threads}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)

    table = "\n".join(f"| {row['round']} | {row['first']} | {row['reef_lab_tok_s']:.0f} | {row['trl_tok_s']:.0f} | "
                      f"{row['ratio']:.3f} | {row['reef_lab_s_per_step']:.3f} | {row['trl_s_per_step']:.3f} | "
                      f"{row['reef_lab_peak_rss_mb']:.0f} (+{row['reef_lab_rise_mb']:.0f}) | "
                      f"{row['trl_peak_rss_mb']:.0f} (+{row['trl_rise_mb']:.0f}) |" for row in timed)
    s = summ

    def stat(key: str, f: str) -> str:
        return " | ".join(format(s[key][q], f) for q in ("median", "min", "max"))

    optim = getattr(cfg.optim, "value", cfg.optim)
    md = f"""# reef_lab TorchTrainer vs TRL GRPOTrainer: update speed per token (CPU)

Claim tested: "the reef_lab trainer is at least as fast per token as TRL's GRPOTrainer". On this run the claim
**{verdict}**: median ratio reef_lab/TRL = **{s['ratio']['median']:.3f}** (min {s['ratio']['min']:.3f}, max
{s['ratio']['max']:.3f}; ratio of median throughputs {ratio_of_medians:.3f}).

Command: `{meta['command']}`

- Model: random-init Llama (hidden 256, 4 layers, 4 heads / 2 KV heads, intermediate 768, tied embeddings),
  {n_params:,} parameters, vocab {len(tok)} (SmolLM2 tokenizer), fp32, CPU, `torch.set_num_threads({args.threads})`
  on a {os.cpu_count()}-core machine, both trainers in one process, each with its own copy of the model and AdamW.
- Batch: {args.batch} sequences per optimizer step ({args.batch // args.group} prompts x {args.group} completions),
  micro-batches of {args.micro_batch} ({ga} forward/backward passes per step on both sides). Completions generated
  once by TRL (max {args.completion_len} tokens, {gen_s:.1f}s, not timed). Per step: {p_tok} prompt + {c_tok}
  completion = **{tokens} real tokens** (the count used for both sides); TRL pads each sequence to {padded} tokens.
- {args.rounds} timed rounds after one discarded warm-up round, {args.steps} optimizer steps per side per round, the
  side that goes first alternating every round. lr 1e-5, grad-norm clip 1.0, no KL term on either side.

## What is timed

- **reef_lab**: `TorchTrainer.step(samples, reef_lab.trainers.losses.dis_token_loss(0.3, 5.0))`: zero_grad, per
  micro-batch packing (right padding to the micro-batch's longest sequence), forward to the last hidden states,
  the LM head on trained positions only, {reef.config.logprob_chunk} at a time (recomputed in backward; 0: full
  logits), logsumexp/gather, DIS loss, backward; grad clip; `AdamW.step()`; gradients freed, malloc_trim.
- **TRL**: per micro-batch `GRPOTrainer.training_step(model, inputs, num_items_in_batch)` (TRL's `compute_loss`:
  fused LM head on completion positions only, entropy, `{cfg.loss_type}` loss with clipping, metrics, backward via
  accelerate); then `_clip_grad_norm`, `optimizer.step()` (`{optim}`), `lr_scheduler.step()`,
  `model.zero_grad()`. GRPO's `_prepare_inputs` (which generates) is replaced by the identity, so the pre-generated
  micro-batches go straight in; the Trainer loop's callbacks/logging around the step are not timed.
- Neither side's generation is timed: reef_lab's trainer never generates (its serving engine does).

## Per round (tokens/s = real prompt+completion tokens per step / seconds per step)

| round | first | reef_lab tok/s | TRL tok/s | ratio | reef_lab s/step | TRL s/step | reef_lab peak RSS MB (rise) | TRL peak RSS MB (rise) |
|---|---|---|---|---|---|---|---|---|
{table}

| | median | min | max |
|---|---|---|---|
| reef_lab tok/s | {stat('reef_lab_tok_s', '.0f')} |
| TRL tok/s | {stat('trl_tok_s', '.0f')} |
| ratio reef_lab/TRL | {stat('ratio', '.3f')} |
| reef_lab peak RSS MB | {stat('reef_lab_peak_rss_mb', '.0f')} |
| TRL peak RSS MB | {stat('trl_peak_rss_mb', '.0f')} |
| reef_lab rise MB | {stat('reef_lab_rise_mb', '.0f')} |
| TRL rise MB | {stat('trl_rise_mb', '.0f')} |

Peak RSS: the process's high-water mark during a side's {args.steps} steps (the kernel's VmHWM, reset before them),
in MB; the rise is that peak less the RSS the side started from. Both sides share the process, so each peak includes
the other side's model and AdamW state.

Versions: torch {versions['torch']}, transformers {versions['transformers']}, trl {versions['trl']}, Python
{versions['python']}. Plot: `{args.out.with_suffix('.png').name}`; raw numbers: `{data_link(args.out)}`.

Caveats: one tiny model on a shared 2-core CPU (other jobs may run; alternation and medians reduce, not remove,
that noise); the same generated batch is reused for every step; the losses differ in detail (DIS mask vs TRL's
clipped `{cfg.loss_type}` loss with entropy), as do the padding and LM-head strategies listed above, which is part
of what is being compared. Results on a GPU or a larger model may differ.
"""
    args.out.with_suffix(".md").write_text(md)
    print(f"wrote {args.out.with_suffix('.md')} (+ .json, .png); median ratio {s['ratio']['median']:.3f}; median "
          f"peak RSS reef_lab {s['reef_lab_peak_rss_mb']['median']:.0f} MB (+{s['reef_lab_rise_mb']['median']:.0f}), "
          f"TRL {s['trl_peak_rss_mb']['median']:.0f} MB (+{s['trl_rise_mb']['median']:.0f})")


if __name__ == "__main__":
    main()
