"""The tests' tiny model, for anyone: a random-init ~6M-parameter Llama with SmolLM2's tokenizer, so a recipe trains
and releases in seconds on a CPU (it answers nonsense: it is for trying the plumbing, not for results).

    .venv/bin/python scripts/serve.py --model-path tiny --recipe sft

`--model-path tiny` (the embedded engine) builds it once into the deployment's data dir
(`<data_dir>/models/tiny-llama`, seed 0, so every build is the same model; never the user's model cache, which holds
real conversions) and loads it from there; tests/conftest.py builds the same one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

TINY = "tiny"
FOLDER = "tiny-llama"


def smollm2_tokenizer(cache_dir: Path):
    """SmolLM2's tokenizer: from the converted model in the cache when it is there (fast), else from the GGUF."""
    from transformers import AutoTokenizer

    from reef_lab.engines.embedded.loading import DEFAULT_MODEL_NAME, default_gguf_path

    cached = Path(cache_dir) / DEFAULT_MODEL_NAME
    if (cached / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    gguf = default_gguf_path()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def build_tiny_model(tokenizer):
    """The tiny Llama; untied embeddings and a wide init make its outputs vary with the prompt."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
        tie_word_embeddings=False, initializer_range=0.3, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def tiny_model_dir(cache_dir: Path) -> Path:
    """The tiny model as a Hugging Face folder in the cache, written whole the first time it is asked for."""
    folder = Path(cache_dir) / FOLDER
    if (folder / "config.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = smollm2_tokenizer(cache_dir)
    staged = Path(tempfile.mkdtemp(prefix=".tiny-", dir=folder.parent))
    try:
        build_tiny_model(tokenizer).save_pretrained(staged)
        tokenizer.save_pretrained(staged)
        os.replace(staged, folder)
    except OSError:
        shutil.rmtree(staged, ignore_errors=True)
        if not (folder / "config.json").is_file():  # not another process that finished first
            raise
    return folder
