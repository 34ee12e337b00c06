"""Deployment configuration: one dataclass, read from the command line and from a YAML file.

Each field's help text is the `--help` of `scripts/serve.py`; a YAML file given with `-c` uses the same names
(dashes or underscores), and the command line wins over the file.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import yaml

from reef_lab.engines import engine_class
from reef_lab.engines.base import ReleaseHost
from reef_lab.errors import ReefError
from reef_lab.recipe import load_recipe


@dataclass
class ServeConfig:
    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on"})
    port: int = field(default=8900, metadata={"help": "port to listen on"})
    data_dir: str = field(default="./.reef_lab", metadata={
        "help": "folder that holds all state: records (log + Parquet), scenarios, model cache"})
    recipe: str = field(default="basic", metadata={
        "help": "recipe of new scenarios: a folder name in recipes/ (basic, sft, sao, grpo, gepa) or a "
                "module:Class path"})
    recipe_config: str | dict | None = field(default=None, metadata={
        "help": "config of new scenarios' recipe: a YAML/JSON file (in a -c file also a mapping), e.g. "
                "recipes/sao/examples/live.yaml"})
    hub_repo: str | None = field(default=None, metadata={
        "help": "publish each release to this Hub model repo, e.g. me/reef-{scenario} (HF_ENDPOINT, HF_TOKEN); "
                "off by default"})
    hub_private: int = field(default=0, metadata={"help": "1: create Hub repos private"})
    wandb_project: str = field(default="reef_lab", metadata={
        "help": "W&B project of the training scenarios' runs (WANDB_MODE, WANDB_API_KEY; offline by default)"})
    wandb_entity: str | None = field(default=None, metadata={"help": "W&B entity (team or user)"})
    wandb_group: str = field(default="live", metadata={"help": "W&B group of the live scenarios' runs"})
    wandb_mode: str | None = field(default=None, metadata={
        "help": "offline, online or disabled (default: WANDB_MODE, else online with WANDB_API_KEY, else offline)"})
    engine: str | None = field(default=None, metadata={
        "help": "the engine: embedded (a local model in this process), upstream (relay a provider) or a "
                "module:Class path of a reef_lab.engines.base.Engine; default: upstream with --upstream-url, else "
                "embedded"})
    engine_options: str | dict | None = field(default=None, metadata={
        "help": "a module:Class engine's own settings: a YAML/JSON mapping (inline or a file)"})
    upstream_url: str | None = field(default=None, metadata={
        "help": "proxy this OpenAI- or Anthropic-compatible provider (e.g. https://api.openai.com) instead of "
                "the embedded model; its key comes from REEF_UPSTREAM_API_KEY"})
    upstream_model: str | None = field(default=None, metadata={
        "help": "model name sent upstream (replaces the client's 'model'); default: the client's"})
    upstream_timeout: float = field(default=120.0, metadata={
        "help": "seconds to wait for the upstream provider before answering 504"})
    model_path: str | None = field(default=None, metadata={
        "help": "serve another local model (a transformers folder or a .gguf file) instead of the embedded "
                "default SmolLM2-135M-Instruct"})
    max_batch: int = field(default=16, metadata={"help": "most requests the embedded engine decodes together"})
    threads: int = field(default=32, metadata={
        "help": "requests in progress at once per worker (each open stream holds one until it ends); more wait"})
    http_server: str = field(default="threads", metadata={
        "help": "threads: reef_lab's HTTP/1.1 server (server/httpd.py: a thread per connection, bodies read whole "
                "with a timeout before the app runs); granian: the granian WSGI server, which has no body read "
                "timeout (a client that never sends its declared body holds a request thread)"})
    read_timeout: float = field(default=30.0, metadata={
        "help": "seconds a request's body (or its headers) may take to arrive before the answer is 408 "
                "(threads server)"})
    workers: int = field(default=0, metadata={
        "help": "worker processes; 0: one per CPU (at most 8) with --upstream-url, else 1. Several need "
                "--upstream-url (the embedded model lives in one process): one primary keeps all state, the "
                "others relay inference (server/workers.py)"})
    pin_workers: int = field(default=1, metadata={
        "help": "1: pin each of several workers to a CPU of its own (Linux; about 30%% more requests/s on 2 "
                "cores); 0: leave placement to the OS scheduler"})
    sched_slice_us: int = field(default=100, metadata={
        "help": "with --upstream-url, the CPU time slice in microseconds each worker thread asks the Linux scheduler "
                "for (EEVDF custom slices, kernel 6.12+; older kernels ignore it): a short one lets a thread woken by "
                "its record's flush or its provider's answer run sooner. 0: the kernel's default"})
    sched_slice_busy: float = field(default=0.85, metadata={
        "help": "the share of the machine's CPU time in use (over 0.25 s) above which worker threads give the short "
                "slice back and take the kernel's default, until it falls below this less 0.15: at saturation a "
                "short slice only adds preemptions. 1: keep the short slice always"})
    allowed_recipes: str | None = field(default=None, metadata={
        "help": "comma-separated recipes that clients may name in POST /reef/scenarios besides the folders of "
                "recipes/ and --recipe (names or module:Class paths; a client can never name code itself)"})
    max_body_mb: float = field(default=10.0, metadata={
        "help": "largest JSON body of an inference or any other request, in MB (413 beyond)"})
    max_report_kb: float = field(default=1024.0, metadata={"help": "largest report body, in KB (413 beyond)"})
    max_import_mb: float = field(default=32.0, metadata={
        "help": "largest POST /reef/records/batch body, in MB (413 beyond)"})
    max_json_depth: int = field(default=64, metadata={
        "help": "deepest nesting of objects and arrays a JSON body may have (400 beyond)"})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.upstream_model and not self.upstream_url:
            raise ValueError("upstream_model needs upstream_url: name the provider to send the model name to")
        if self.upstream_url and self.model_path:
            raise ValueError("give either upstream_url (proxy a provider) or model_path (serve a local model)")
        if self.upstream_url and not self.upstream_url.startswith(("http://", "https://")):
            raise ValueError(f"upstream_url must start with http:// or https://, got {self.upstream_url!r}")
        if self.max_batch < 1 or self.threads < 1:
            raise ValueError("max_batch and threads must be at least 1")
        if isinstance(self.recipe_config, str) and not Path(self.recipe_config).is_file():
            raise ValueError(f"recipe_config file {self.recipe_config!r} does not exist")
        if self.wandb_mode not in (None, "offline", "online", "disabled"):
            raise ValueError(f"wandb_mode must be offline, online or disabled, got {self.wandb_mode!r}")
        if self.workers < 0:
            raise ValueError(f"workers must be 0 (automatic) or more, got {self.workers}")
        if self.http_server not in ("threads", "granian"):
            raise ValueError(f"http_server must be threads or granian, got {self.http_server!r}")
        if not 1 <= self.read_timeout <= 600:
            raise ValueError(f"read_timeout must be 1..600 seconds, got {self.read_timeout}")
        if self.workers > 1 and not self.upstream_url:
            raise ValueError("workers above 1 need upstream_url: the embedded model and its batching live in one "
                             "process (use --workers 1, or proxy a provider with --upstream-url)")
        if self.sched_slice_us and not 100 <= self.sched_slice_us <= 100_000:
            raise ValueError(f"sched_slice_us must be 0 (the kernel's default) or 100..100000 (the range Linux "
                             f"takes), got {self.sched_slice_us}")
        if not 0.5 <= self.sched_slice_busy <= 1:
            raise ValueError(f"sched_slice_busy must be a share of CPU time in 0.5..1, got {self.sched_slice_busy}")
        if min(self.max_body_mb, self.max_report_kb, self.max_import_mb) <= 0:
            raise ValueError("max_body_mb, max_report_kb and max_import_mb must be positive")
        if not 2 <= self.max_json_depth <= 200:
            raise ValueError(f"max_json_depth must be in 2..200 (records nest the body a few levels deeper, and "
                             f"the JSON writer stops at 254), got {self.max_json_depth}")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ValueError("log_level must be debug, info, warning or error")

    def engine_name(self) -> str:
        return self.engine or ("upstream" if self.upstream_url else "embedded")

    def engine_settings(self) -> dict:
        """The engine's own settings as a mapping (read from the file when a path was given)."""
        value = self.engine_options
        if value is None or isinstance(value, dict):
            return dict(value or {})
        data = yaml.safe_load(Path(value).read_text() if Path(value).is_file() else value)
        if not isinstance(data, dict):
            raise ValueError(f"engine_options must be a mapping of the engine's settings, got {value!r}")
        return data

    def worker_count(self) -> int:
        if self.workers:
            return self.workers
        return min(os.cpu_count() or 1, 8) if self.upstream_url else 1

    def recipe_settings(self) -> dict:
        """The recipe config as a mapping (read from the file when a path was given)."""
        if self.recipe_config is None or isinstance(self.recipe_config, dict):
            return dict(self.recipe_config or {})
        data = yaml.safe_load(Path(self.recipe_config).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{self.recipe_config} must hold a mapping of the recipe's config fields")
        return data

    def allowed_recipe_list(self) -> list[str]:
        return [r.strip() for r in (self.allowed_recipes or "").split(",") if r.strip()]

    def to_dict(self) -> dict:
        return asdict(self)


def _type_of(f) -> type:
    t = f.type if isinstance(f.type, str) else f.type.__name__
    return {"int": int, "float": float}.get(t.split(" ")[0], str)


def parse_serve_config(argv: list[str] | None = None) -> ServeConfig:
    """ServeConfig from `-c file.yaml` plus flags; flags win."""
    p = argparse.ArgumentParser(prog="scripts/serve.py", description=(
        "Run the reef_lab gateway: the providers' APIs (OpenAI chat/responses, Anthropic messages) in front of "
        "the embedded model or an upstream provider; every interaction recorded, reports taken at /reef/report. "
        "Auth: set REEF_TOKEN (comma-separated for several tokens); unset means no auth (loopback use)."))
    p.add_argument("-c", "--config", help="YAML file with any of the options below (command line wins)")
    for f in fields(ServeConfig):
        default = f.default if f.default is not MISSING else None
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=_type_of(f), default=None,
                       help=f"{f.metadata['help']} (default: {default})")
    args = p.parse_args(argv)
    values: dict = {}
    if args.config:
        data = yaml.safe_load(Path(args.config).read_text()) or {}
        if not isinstance(data, dict):
            p.error(f"{args.config} must hold a mapping of option names to values")
        names = {f.name for f in fields(ServeConfig)}
        for k, v in data.items():
            key = k.replace("-", "_")
            if key not in names:
                p.error(f"{args.config}: unknown option {k!r}; known: {sorted(names)}")
            values[key] = v
    values.update({k: v for k, v in vars(args).items() if k != "config" and v is not None})
    try:
        cfg = ServeConfig(**values)
        recipe = load_recipe(cfg.recipe, cfg.recipe_settings())
        for extra in cfg.allowed_recipe_list():
            load_recipe(extra)
    except (ValueError, TypeError) as e:
        p.error(str(e))
    except ReefError as e:
        p.error(e.message)
    try:
        engine = engine_class(cfg.engine_name())
    except ValueError as e:
        p.error(str(e))
    if recipe.evolves == "weights" and not issubclass(engine, ReleaseHost):
        p.error(f"recipe {cfg.recipe!r} trains model weights, which engine {cfg.engine_name()!r} cannot serve (an "
                "upstream provider): drop --upstream-url to serve (and train) the embedded model, or choose a "
                "recipe that does not train")
    return cfg


def tokens_from_env() -> list[str]:
    return [t.strip() for t in os.environ.get("REEF_TOKEN", "").split(",") if t.strip()]
