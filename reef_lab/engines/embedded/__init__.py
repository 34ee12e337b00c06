"""The embedded engine (engine.py): the model runs inside the reef_lab process, with transformers + torch.

The names other code uses (`--engine embedded`, scripts, tests) are importable from here.
"""

from reef_lab.engines.embedded.engine import DEFAULT_MODEL_NAME, EmbeddedEngine, default_cache_dir, load_model

__all__ = ["DEFAULT_MODEL_NAME", "EmbeddedEngine", "default_cache_dir", "load_model"]
