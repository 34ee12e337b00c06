"""Same seed, same run (issue 39): bit-identical step losses and release weights on CPU, whatever the load.

Two paths. An experiment (reef_lab.experiments.weights, `deterministic` by default) run twice on the tiny model with a
continuous reward, the second time beside a busy loop: every step's loss and the released weights are equal to the
last bit. The live path: the same demonstrations imported over HTTP by concurrent clients in two different orders,
then trained in manual rounds: the same losses and weights (before, a batch's records came back in a different order
each run: ids within one millisecond sorted by their random bits).
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import threading
from pathlib import Path

import requests
import torch

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.experiments.weights import ExperimentConfig, run_experiment
from reef_lab.gateway.gateway import Gateway
from reef_lab.learning.learner import read_metrics
from reef_lab.learning.tasks import Task
from tests.conftest import Running


class CharSum(Task):
    """A reward the tiny random model's answers vary on (so every step has a gradient): a digest of the reply."""

    def items(self, n, seed):
        return [{"id": f"c{seed}-{i}", "messages": [{"role": "user", "content": f"Say something about {seed} {i}."}]}
                for i in range(n)]

    def score(self, item, text):
        return (sum(map(ord, text)) % 97) / 97.0


def weights_digest(folder: Path) -> str:
    """A digest of a release's tensors, name by name (the files' headers also hold its lineage: ids and times)."""
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for f in sorted(folder.glob("*.safetensors")):
        for name, tensor in sorted(load_file(f).items()):
            h.update(name.encode())
            h.update(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def experiment(tiny_model_dir, out: Path) -> tuple[list[float], list[str], list[str]]:
    task = {"name": "tests.test_reproducibility:CharSum"}
    cfg = ExperimentConfig(name="repro", recipe="grpo", seed=3, model_path=str(tiny_model_dir), engine="embedded",
                           rollouts=32, concurrency=8, max_pool=8, max_tokens=6, task=task, out_dir=str(out),
                           wandb={"mode": "disabled"}, recipe_config={
                               "group_size": 4, "batch_size": 8, "steps_per_candidate": 2, "selection": "always",
                               "eval_task": task, "eval_size": 4, "eval_max_tokens": 6,
                               "trainer": {"lr": 1e-3, "micro_batch_size": 4}})
    run_experiment(cfg, progress=False)
    rows = read_metrics(out / "data" / "learn" / "repro" / "metrics.jsonl")
    releases = sorted((out / "data" / "releases" / "repro").glob("v*"))
    served = sorted((r["k"], r["release"]) for r in map(json.loads, (out / "rollouts.jsonl").read_text().splitlines()))
    return [r["loss"] for r in rows if r["event"] == "step"], [weights_digest(r) for r in releases], served


def test_an_experiment_gives_the_same_losses_and_weights_twice_also_under_load(tiny_model_dir, tmp_path):
    first = experiment(tiny_model_dir, tmp_path / "a")
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        second = experiment(tiny_model_dir, tmp_path / "b")
    finally:
        proc.kill()
        proc.wait()
    losses, weights, served = first
    assert len(losses) == 4 and any(loss != 0 for loss in losses) and len(weights) == 2, first
    assert second == first  # every loss, both releases' weights and which release served each rollout


def test_concurrent_imports_in_any_order_train_the_same(tiny_model_dir, tmp_path):
    demos = [{"id": f"d{i}", "scenario": "s", "kind": "train", "score": 1.0,
              "request": {"messages": [{"role": "user", "content": f"q{i}"}]},
              "response": {"role": "assistant", "content": f"a{i}"},
              "prompt_token_ids": [1, 9, 14 + i], "token_ids": [20 + (7 * i) % 90, 31 + i % 13, 2]}
             for i in range(24)]

    def run(name: str, order_seed: int) -> tuple[list[float], str]:
        s = Running(Gateway(tmp_path / name, EmbeddedEngine.from_path(str(tiny_model_dir))))
        try:
            requests.post(s.url + "/reef/scenarios", json={"name": "s", "recipe": "sft", "config": {
                "mode": "manual", "batch_size": 8, "steps_per_candidate": 3,
                "trainer": {"lr": 1e-3, "micro_batch_size": 4}}}, timeout=60).raise_for_status()
            shuffled = random.Random(order_seed).sample(demos, len(demos))
            parts = [shuffled[k::4] for k in range(4)]  # four clients, their batches interleaving as they may
            threads = [threading.Thread(target=lambda p=p: requests.post(
                s.url + "/reef/records/batch", json={"records": p}, timeout=120).raise_for_status()) for p in parts]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for _ in range(3):
                assert requests.post(s.url + "/reef/train", json={"scenario": "s"}, timeout=60).status_code == 202
                assert s.gateway.learner("s").wait_idle(300)
            rows = read_metrics(tmp_path / name / "learn" / "s" / "metrics.jsonl")
            release = next((tmp_path / name / "releases" / "s").glob("v1"))
            return [r["loss"] for r in rows if r["event"] == "step"], weights_digest(release)
        finally:
            s.stop()

    a, b = run("a", 0), run("b", 1)
    assert len(a[0]) == 3 and a == b, (a, b)
