"""A distillation teacher scored by a real vLLM CPU server (`bash scripts/setup.sh --vllm`) on SmolLM2: the wire
format the double (reef_lab/testing/vllm_scoring.py) plays, checked against the server itself: the teacher's logprobs
of the student's own token ids, and its top-K, agree with the trainer scoring the same weights."""

from __future__ import annotations

import copy

import pytest
import torch

from reef_lab.engines.embedded import DEFAULT_MODEL_NAME, default_cache_dir
from reef_lab.engines.vllm import VLLMEngine
from reef_lab.learning.distill import TeacherConfig, resolve_teacher
from reef_lab.tasks.base import make_task
from reef_lab.testing import free_port
from reef_lab.testing.vllm_scoring import vllm_model
from reef_lab.trainers.base import TrainerConfig
from reef_lab.trainers.samples import Sample
from reef_lab.trainers.torch_trainer import TorchTrainer

pytestmark = [pytest.mark.heavy, pytest.mark.vllm]

MODEL = default_cache_dir() / DEFAULT_MODEL_NAME


def test_a_real_vllm_server_scores_a_teacher_as_the_trainer_does():
    if vllm_model() is None:
        pytest.skip("vLLM is not installed: bash scripts/setup.sh --vllm")
    engine = VLLMEngine(MODEL, port=free_port())
    try:
        teacher = resolve_teacher(TeacherConfig(server_url=engine.url), MODEL, releaser=None)
        assert teacher.server.model.endswith(DEFAULT_MODEL_NAME)  # the served model; the tokenizer probe passed
        trainer = TorchTrainer(MODEL, TrainerConfig(device="cpu"))
        samples = []
        for i, item in enumerate(make_task().items(3, seed=4)):
            prompt = trainer_prompt = engine.prompt_ids(item["messages"])
            completion = engine.completion_ids(f"The answer is {item['answer']}.")
            samples.append(Sample(f"s{i}", prompt, completion, None, None, "base"))
            assert trainer_prompt
        reference = copy.deepcopy(samples)
        teacher.server.score(samples, [s.prompt_ids for s in samples], top_k=5)
        trainer.score_teacher(reference, None, None, top_k=5)
        diffs = [abs(a - b) for s, r in zip(samples, reference)
                 for a, b in zip(s.teacher_logprobs, r.teacher_logprobs, strict=True)]
        # measured: max |diff| below 1e-4 nats (fp32 on CPU); kernels that sum in another order may differ slightly
        assert max(diffs) < 1e-3, max(diffs)
        same_top = [a[0] == b[0] for s, r in zip(samples, reference)
                    for a, b in zip(s.teacher_top_ids, r.teacher_top_ids, strict=True)]
        assert sum(same_top) >= 0.9 * len(same_top)  # the most likely token agrees (near-ties may swap)
        print(f"vLLM teacher vs trainer: max |diff| {max(diffs):.4f} nats over {len(diffs)} tokens, "
              f"top-1 agrees at {sum(same_top)}/{len(same_top)} positions")
        assert all(torch.tensor(s.teacher_top_logprobs).diff(dim=-1).le(1e-6).all() for s in samples)  # ranked
    finally:
        engine.close()
