"""Checkpoints: the one place that checks and loads a release's weights, shared by the trainers and every engine.

A checkpoint is a Hugging Face model folder (safetensors, config, tokenizer) stamped with reef_lab metadata; a
broken one is refused with the reason before anything that serves is touched.
"""

from __future__ import annotations

import json
from pathlib import Path

from reef_lab.extras import need

need("train", "checkpoints")
import torch


def load_checkpoint(model, folder: Path) -> None:
    """Load the safetensors weights in `folder` into `model` after checking them: every parameter the model has
    (tied copies aside) is present with its shape, nothing unknown, all values finite. Raises ValueError naming the
    problem; the model is untouched unless every check passed."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors file in {folder}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"checkpoint {f} cannot be read: {e}") from e
    own = model.state_dict()
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise ValueError(f"checkpoint {folder} has tensors this model does not: {unknown[:5]}")
    tied = {k for k in own if k.endswith("lm_head.weight")} if getattr(model.config, "tie_word_embeddings",
                                                                         False) else set()
    missing = sorted(set(own) - set(state) - tied)
    if missing:
        raise ValueError(f"checkpoint {folder} lacks tensors: {missing[:5]}")
    for k, v in state.items():
        if v.shape != own[k].shape:
            raise ValueError(f"checkpoint {folder}: {k} has shape {tuple(v.shape)}, the model {tuple(own[k].shape)}")
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise ValueError(f"checkpoint {folder}: {k} holds non-finite values")
    model.load_state_dict(state, strict=False)
    if tied:
        model.tie_weights()


def stamp_checkpoint(folder: Path, metadata: dict) -> None:
    """Put reef_lab's metadata into the checkpoint's safetensors header (string values) and beside it as JSON."""
    from safetensors.torch import load_file, save_file

    for f in sorted(folder.glob("*.safetensors")):
        tensors = load_file(str(f))
        header = {"format": "pt", "reef_lab": json.dumps(metadata, default=str)}
        save_file(tensors, str(f), metadata=header)
    (folder / "reef_checkpoint.json").write_text(json.dumps(metadata, indent=2, default=str))
