"""Shows the vLLM CPU LoRA batching fault the `vllm` engine works around (reef_lab/engines/vllm.py, `lora`):
requests without an adapter, batched with adapter requests after another adapter has served, get logprobs that are
not the base model's; the same requests through a zero adapter get the base's.

    python scripts/studies/probe_vllm_lora_batching.py RELEASE_FOLDER   # a release with adapter/ (trainer.lora_rank > 0)
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path


from reef_lab.engines.base import ChatRequest, SamplingParams  # noqa: E402
from reef_lab.engines.embedded import DEFAULT_MODEL_NAME, default_cache_dir  # noqa: E402
from reef_lab.engines.vllm import VLLMEngine  # noqa: E402
from reef_lab.testing.vllm_scoring import reference_logprobs  # noqa: E402


def main(release: Path) -> None:
    model = default_cache_dir() / DEFAULT_MODEL_NAME
    engine = VLLMEngine(model, port=8953, transport="lora", max_loras=2, max_lora_rank=8)
    msgs = [{"role": "user", "content": "What is 7+5?"}]
    try:
        engine.load_release("c1", release)  # an adapter that has served a request (a candidate under evaluation)
        engine.submit(ChatRequest(msgs, SamplingParams(max_tokens=4), release="c1")).result()
        engine.load_release("v1", release)
        engine.route("a", "v1")
        for label, zero in (("no adapter", None), ("zero adapter", engine._zero)):
            engine._zero = zero  # None: base requests name no adapter, as vLLM's own clients would
            out = {}

            def ask(scenario, k):
                out[(scenario, k)] = engine.submit(ChatRequest(msgs, SamplingParams(
                    max_tokens=6, temperature=0.7, seed=k), scenario=scenario)).result()
            threads = [threading.Thread(target=ask, args=(s, k)) for s in "ab" for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for (s, k), g in sorted(out.items()):
                ref = reference_logprobs(release if s == "a" else model, g.prompt_token_ids, g.token_ids, 0.7)
                print(f"{label:12s} scenario {s} seed {k}: max |logprob - reference| = "
                      f"{max(abs(x - y) for x, y in zip(ref, g.logprobs)):.5f}", flush=True)
    finally:
        engine.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
