"""Deployment configuration: one dataclass, read from the command line and from a YAML file.

Each field's help text is the `--help` of `scripts/serve.py`; a YAML file given with `-c` uses the same names
(dashes or underscores), and the command line wins over the file.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from pathlib import Path

import orjson
import yaml

from reef_lab.bounded_yaml import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, load_text, read_file  # noqa: F401 - re-exported
from reef_lab.engines import engine_class
from reef_lab.engines.base import ReleaseHost
from reef_lab.engines.upstream import UPSTREAM_DIALECTS
from reef_lab.errors import ReefError
from reef_lab.learning.recipe import evolved, load_recipe, shipped_recipes
from reef_lab.plugins import code_paths
from reef_lab.records.retention import RetentionConfig, RetentionPolicy


@dataclass
class ServeConfig:
    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on"})
    port: int = field(default=8900, metadata={"help": "port to listen on"})
    data_dir: str = field(default="./.reef_lab", metadata={
        "help": "folder that holds all state: records (log + Parquet), scenarios, model cache"})
    state: str = field(default="data-dir", metadata={
        "help": "where the deployment's shared state lives: 'data-dir' (everything in --data-dir, one machine, no "
                "database) or a PostgreSQL URL, postgresql://user@host:port/db, that several gateways and learners "
                "share (records committed there before each receipt; docs/deploy.md)"})
    service: str = field(default="all", metadata={
        "help": "what this process runs: 'all' (serve and learn: one process), 'gateway' (serve agents' traffic; "
                "learners run elsewhere) or 'learner' (the learners only: one per scenario in the deployment, by a "
                "lease in the database); gateway and learner need --state postgresql://..."})
    artifacts: str | None = field(default=None, metadata={
        "help": "folder releases are written to and served from (default: <data dir>/releases); in a shared "
                "deployment a folder every gateway and learner mounts at the same path, or an object store's URL "
                "(s3://bucket/prefix, gs://..., any fsspec URL with its package installed) each service fetches the "
                "releases it serves from"})
    recipe: str = field(default="basic", metadata={
        "help": "recipe of new scenarios: a folder name in recipes/ or a module:Class path"})
    recipe_config: str | None = field(default=None, metadata={
        "help": "config of new scenarios' recipe: a YAML/JSON file, e.g. recipes/sao/examples/live.yaml, or "
                "an inline mapping '{batch_size: 8}' (in a -c file also a mapping); --help with --recipe lists its "
                "fields"})
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
    engine_options: str | None = field(default=None, metadata={
        "help": "a module:Class engine's own settings: a YAML/JSON mapping (inline or a file)"})
    upstream_url: str | None = field(default=None, metadata={
        "help": "proxy this OpenAI- or Anthropic-compatible provider (e.g. https://api.openai.com) instead of "
                "the embedded model; its key comes from REEF_UPSTREAM_API_KEY"})
    upstream_model: str | None = field(default=None, metadata={
        "help": "model name sent upstream (replaces the client's 'model'); default: the client's"})
    upstream_timeout: float = field(default=120.0, metadata={
        "help": "seconds to wait for the upstream provider before answering 504"})
    upstream_dialect: str | None = field(default=None, metadata={
        "help": "the dialect the upstream provider speaks: anthropic (/v1/messages), openai-chat "
                "(/v1/chat/completions: vLLM, SGLang, llama.cpp, most open-model hosts) or openai-responses "
                "(/v1/responses); requests in another dialect are translated, answers and streams translated back "
                "(docs/relay.md). Default: none, each request goes to the provider in its client's own dialect, "
                "untranslated (nothing is probed)"})
    upstream_key_from_client: bool = field(default=False, metadata={
        "help": "bring your own key: when reef_lab holds no provider key (REEF_UPSTREAM_API_KEY unset), send the "
                "client's own x-api-key or 'Authorization: Bearer' to the provider. reef_lab's own token (REEF_TOKEN) "
                "is never sent on; with REEF_TOKEN set, a client sends it in the other of the two headers"})
    model_path: str | None = field(default=None, metadata={
        "help": "serve another local model (a transformers folder or a .gguf file) instead of the embedded "
                "default SmolLM2-135M-Instruct"})
    tool_template: str = field(default="auto", metadata={
        "help": "chat template of requests with tools (embedded, vllm, sglang engines): auto (the model's own when it "
                "renders tools, else reef_lab/engines/templates/tool_call.jinja, Hermes-style <tool_call>), model (the "
                "model's own, which must render tools) or a Jinja file; see docs/tools.md"})
    max_batch: int = field(default=16, metadata={"help": "most requests the embedded engine decodes together"})
    prefill_chunk: int = field(default=512, metadata={
        "help": "embedded engine: a prompt longer than this many tokens is prefilled in chunks of at most this "
                "size, one per scheduler step, between the other requests' decode steps (so short requests are not "
                "stuck behind an agent's long prompt); it also bounds the short prompts prefilled together in one "
                "step. 0: every prompt in one step, the behaviour before chunking"})
    prefill_share: float = field(default=0.5, metadata={
        "help": "embedded engine: while other requests are decoding, the share of the engine's time a long "
                "prompt's prefill may take; its chunks shrink to keep to it (at least 16 tokens each), so the "
                "others run at no less than 1 - share of their speed. 1: chunks keep their full size"})
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
        "help": "1: pin each of several workers to a CPU of its own (Linux; more requests/s on 2 cores, "
                "results/server-tuning.md); 0: leave placement to the OS scheduler"})
    sched_slice_us: int = field(default=0, metadata={
        "help": "opt-in (no gain measured, results/server-tuning.md): with --upstream-url, the CPU time slice in "
                "microseconds each worker thread asks the Linux scheduler for (EEVDF custom slices, kernel 6.12+; "
                "older kernels ignore it), e.g. 100: a thread woken by its record's flush or its provider's answer "
                "may run sooner. 0: the kernel's default"})
    sched_slice_busy: float = field(default=0.85, metadata={
        "help": "the share of the machine's CPU time in use (over 0.25 s) above which worker threads give the short "
                "slice back and take the kernel's default, until it falls below this less 0.15: at saturation a "
                "short slice only adds preemptions. 1: keep the short slice always"})
    allowed_recipes: str | None = field(default=None, metadata={
        "help": "comma-separated recipes that clients may name in POST /reef/scenarios besides the folders of "
                "recipes/ and --recipe (names or module:Class paths; a client can never name code itself)"})
    harness_allow_executable: int = field(default=0, metadata={
        "help": "1: harness releases may hold what an agent runs (scripts such as .sh/.py files or #! lines, "
                "Claude Code's and opencode's !`command`, front matter granting allowed-tools or hooks), by every "
                "path (published by hand, GEPA, change requests); 0: refused with 400 (docs/harness.md)"})
    tokens_file: str | None = field(default=None, metadata={
        "help": "a YAML file of the API's tokens, each by its sha256 with a role (agent, reader or admin) and the "
                "scenarios it may use (names or patterns such as team-a-*); `reef-lab token add` writes one. "
                "REEF_TOKEN adds admin tokens of every scenario; no token at all: no auth (docs/api.md#tokens)"})
    max_body_mb: float = field(default=10.0, metadata={
        "help": "largest JSON body of an inference or any other request, in MB (413 beyond)"})
    max_report_kb: float = field(default=1024.0, metadata={"help": "largest report body, in KB (413 beyond)"})
    max_import_mb: float = field(default=32.0, metadata={
        "help": "largest POST /reef/records/batch body, in MB (413 beyond)"})
    max_scenarios: int = field(default=1000, metadata={
        "help": "the most scenarios the deployment holds: a call, report, import or publish that would create one "
                "more is refused with 403 naming this limit (0: no limit)"})
    max_scenarios_per_token: int = field(default=100, metadata={
        "help": "the most scenarios one token of some scenarios only (a tokens-file entry not an admin of '*') may "
                "create, counted over the scenarios that exist (403 beyond; 0: no limit)"})
    max_json_depth: int = field(default=64, metadata={
        "help": "deepest nesting of objects and arrays a JSON body may have (400 beyond)"})
    retain_max_bytes: str | None = field(default=None, metadata={
        "help": "keep the data dir's records (Parquet segments and logs) under this size, e.g. 20GB: a rolled "
                "segment is evicted once the records newer than it hold this much (so the limit is exceeded by "
                "less than one segment or log per worker writing logs, plus records learners or release lineage "
                "still need; docs/records.md#retention); default: no limit"})
    retain_max_age: str | None = field(default=None, metadata={
        "help": "evict rolled records once older than this, e.g. 30d or 12h (a segment goes when its newest record "
                "is that old); default: no limit"})
    retain_max_records: int | None = field(default=None, metadata={
        "help": "keep at least the newest this many records and evict older rolled segments beyond it; default: "
                "no limit"})
    retain_scenarios: str | None = field(default=None, metadata={
        "help": "tighter limits for some scenarios: a YAML/JSON mapping (inline or a file) of scenario names or "
                "fnmatch patterns to {max_bytes, max_age, max_records}, e.g. '{\"eval-*\": {max_age: 1d}}'; they "
                "evict only that scenario's records and never keep any past the data dir's limits"})
    retain_interval: float = field(default=60.0, metadata={
        "help": "seconds between retention rounds (one also runs after every roll into Parquet)"})
    roll_records: int = field(default=20_000, metadata={
        "help": "records per log before it is rolled into a Parquet segment (the unit retention evicts)"})
    roll_mb: float = field(default=64.0, metadata={
        "help": "MB of log before it is rolled into a Parquet segment, whichever of the two comes first"})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.upstream_model and not self.upstream_url:
            raise ValueError("upstream_model needs upstream_url: name the provider to send the model name to")
        if self.upstream_url and self.model_path:
            raise ValueError("give either upstream_url (proxy a provider) or model_path (serve a local model)")
        if self.upstream_dialect is not None and self.upstream_dialect not in UPSTREAM_DIALECTS:
            raise ValueError(f"upstream_dialect must be one of {', '.join(UPSTREAM_DIALECTS)}, got "
                             f"{self.upstream_dialect!r}")
        if (self.upstream_dialect or self.upstream_key_from_client) and not self.upstream_url:
            raise ValueError("upstream_dialect and upstream_key_from_client need upstream_url: they describe the "
                             "provider reef_lab relays to")
        if self.upstream_url and not self.upstream_url.startswith(("http://", "https://")):
            raise ValueError(f"upstream_url must start with http:// or https://, got {self.upstream_url!r}")
        if self.harness_allow_executable not in (0, 1):
            raise ValueError(f"harness_allow_executable must be 0 or 1, got {self.harness_allow_executable}")
        if self.max_batch < 1 or self.threads < 1:
            raise ValueError("max_batch and threads must be at least 1")
        if self.tool_template not in ("auto", "model") and not Path(self.tool_template).is_file():
            raise ValueError(f"tool_template must be auto, model or a Jinja template file; {self.tool_template!r} is "
                             "not a file")
        if self.prefill_chunk < 0 or 0 < self.prefill_chunk < 16:
            raise ValueError(f"prefill_chunk must be 0 (whole prompts in one step) or at least 16 tokens, got "
                             f"{self.prefill_chunk}")
        if not 0 < self.prefill_share <= 1:
            raise ValueError(f"prefill_share must be in (0, 1] (1: chunks keep their full size), got "
                             f"{self.prefill_share}")
        self.recipe_settings()  # a missing file or a value that is not a mapping is refused at start
        # the engine is resolved and checks its own options now, before any model loads
        engine_class(self.engine_name()).check_options(self.engine_settings())
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
        if self.max_scenarios < 0 or self.max_scenarios_per_token < 0:
            raise ValueError("max_scenarios and max_scenarios_per_token must be 0 (no limit) or more")
        if not 2 <= self.max_json_depth <= 200:
            raise ValueError(f"max_json_depth must be in 2..200 (records nest the body a few levels deeper, and "
                             f"the JSON writer stops at 254), got {self.max_json_depth}")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ValueError("log_level must be debug, info, warning or error")
        if not 1 <= self.retain_interval <= 86_400:
            raise ValueError(f"retain_interval must be 1..86400 seconds, got {self.retain_interval}")
        if self.roll_records < 1 or not 0 < self.roll_mb <= 4096:
            raise ValueError(f"roll_records must be at least 1 and roll_mb in (0, 4096], got {self.roll_records} "
                             f"and {self.roll_mb}")
        self.retention_config()  # a bad size, duration or override is refused at start
        from reef_lab.state import check_spec, is_shared

        check_spec(self.state)
        if self.service not in ("all", "gateway", "learner"):
            raise ValueError(f"service must be all, gateway or learner, got {self.service!r}")
        if self.artifacts and "://" in self.artifacts and not is_shared(self.state):
            raise ValueError(f"--artifacts {self.artifacts}: an object store holds a shared deployment's releases; "
                             "give --state postgresql://... too, or a folder")
        if self.service != "all" and not is_shared(self.state):
            raise ValueError(f"--service {self.service} runs one part of a deployment whose state is shared: give "
                             "--state postgresql://user@host:port/db too (a data dir is one process's)")
        if is_shared(self.state) and self.retention_config().active:
            raise ValueError("--retain-* evicts the data dir's Parquet segments; with --state postgresql://... the "
                             "records live in the database (prune them there): drop the --retain-* flags")
        if self.tokens_file is not None:  # a missing file or a bad entry is refused at start, naming the entry
            from reef_lab.tenants import read_tokens_file

            read_tokens_file(self.tokens_file)

    def engine_name(self) -> str:
        return self.engine or ("upstream" if self.upstream_url else "embedded")

    def engine_settings(self) -> dict:
        """The engine's own settings as a mapping."""
        return _mapping(self.engine_options, "engine_options", "the engine's settings")

    def worker_count(self) -> int:
        if self.service == "learner":
            return 1
        if self.workers:
            return self.workers
        return min(os.cpu_count() or 1, 8) if self.upstream_url else 1

    def recipe_settings(self) -> dict:
        """The recipe config as a mapping."""
        return _mapping(self.recipe_config, "recipe_config", "the recipe's config fields")

    def retention_config(self) -> RetentionConfig:
        """The operator's retention: the data dir's limits and the per-scenario ones (none: keep everything)."""
        policy = RetentionPolicy.parse(self.retain_max_bytes, self.retain_max_age, self.retain_max_records,
                                       where="retain_")
        return RetentionConfig.from_mapping(policy, _mapping(self.retain_scenarios, "retain_scenarios",
                                                             "scenario names to limits"), self.retain_interval)

    def roll_bytes(self) -> int:
        return int(self.roll_mb * (1 << 20))

    def allowed_recipe_list(self) -> list[str]:
        return [r.strip() for r in (self.allowed_recipes or "").split(",") if r.strip()]

    def code_paths(self) -> list[str]:
        """Every module:Class this deployment's operator named (options, recipe config, engine options, allowed
        recipes): all that the plug-in loader may import in a server process (reef_lab.plugins.restrict_to)."""
        named = [self.to_dict(), self.recipe_settings(), self.engine_settings(), self.allowed_recipe_list()]
        return [path for _, path in code_paths(named)]

    def tenants(self):
        """The deployment's tokens (reef_lab.tenants): the tokens file's and REEF_TOKEN's (admins of every
        scenario)."""
        from reef_lab.tenants import Tenants

        return Tenants.load(tokens_from_env(), self.tokens_file)

    def to_dict(self) -> dict:
        return asdict(self)


def load_config_text(text: str, name: str) -> object:
    """A YAML/JSON config's value, refused with a message naming `name` and the limit when it is over
    MAX_CONFIG_BYTES (1 MB), nested deeper than MAX_CONFIG_DEPTH, holds an alias or is not YAML
    (reef_lab.bounded_yaml)."""
    return load_text(text, name, MAX_CONFIG_BYTES, "a config")


def read_config_file(path: str, name: str) -> object:
    """load_config_text of a file, its size checked before it is read (reef_lab.bounded_yaml.read_file)."""
    return read_file(path, name)


def _mapping(value, name: str, what: str) -> dict:
    """A mapping given as itself (in code), as a YAML/JSON file's path, or inline as YAML/JSON text."""
    if value is None or isinstance(value, dict):
        return dict(value or {})
    if value.lstrip().startswith("{"):
        data = load_config_text(value, name)
    else:
        if not Path(value).is_file():
            raise ValueError(f"{name} file {value!r} does not exist (give a YAML/JSON file or an inline mapping "
                             "'{key: value}')")
        data = read_config_file(value, name) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{name} ({value[:200]!r}) must hold a mapping of {what}")
    return data


DESCRIPTION = (
    "Run the reef_lab gateway: the providers' APIs (OpenAI chat/responses, Anthropic messages) in front of the "
    "embedded model or an upstream provider; every interaction recorded, reports taken at /reef/report. Auth: set "
    "REEF_TOKEN (comma-separated admin tokens) and/or --tokens-file (tokens scoped to scenarios and roles); neither "
    "means no auth (loopback use).")


class _HelpFormat(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, whose error is one line naming the problem: its default put a usage of some 35 lines (one per
    option) before it, so the line that says what to fix scrolled away."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists every option)\n")


def parse_serve_config(argv: list[str] | None = None) -> ServeConfig:
    """ServeConfig from `-c file.yaml` plus flags (flags win), one flag per field (`dataclass_parser`). The recipe
    config is checked at every depth before anything starts; `--help` lists the chosen recipe's own fields, and
    `--print-config` prints the whole effective configuration as a YAML file `-c` reads back."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("-c", "--config")
    pre.add_argument("--recipe")
    known, _ = pre.parse_known_args(argv)
    file_values, file_error = {}, None
    if known.config:
        try:
            file_values = _read_config_file(known.config)
        except ValueError as e:
            file_error = str(e)
    spec = known.recipe or file_values.get("recipe") or "basic"
    # the recipes this installation ships are its folders, read now (no list to keep up to date)
    recipes = {"recipe": f"recipe of new scenarios: one of the folders of recipes/ ({', '.join(shipped_recipes())}) "
                         "or a module:Class path"}
    p = dataclass_parser(ServeConfig, helps=recipes, prog="scripts/serve.py", description=DESCRIPTION,
                         formatter_class=_HelpFormat, epilog=_recipe_help(spec))
    p.add_argument("-c", "--config", help="YAML file with any of the options below (the command line wins)")
    p.add_argument("--print-config", action="store_true", help=(
        "print the effective configuration (the deployment's options and the recipe's config, every field with "
        "its help) as YAML that -c reads back, and exit"))
    if file_error:
        p.error(file_error)
    p.set_defaults(**file_values)
    try:
        ns = p.parse_args(argv)
        cfg = ServeConfig(**{f.name: getattr(ns, f.name) for f in fields(ServeConfig)})
        recipe = load_recipe(cfg.recipe, cfg.recipe_settings())
        for name in cfg.allowed_recipe_list():
            load_recipe(name)
        engine = engine_class(cfg.engine_name())
    except (ValueError, TypeError) as e:
        p.error(str(e))
    except ReefError as e:
        p.error(e.message)
    if "weights" in evolved(recipe) and not issubclass(engine, ReleaseHost):
        p.error(f"recipe {cfg.recipe!r} trains model weights, which engine {cfg.engine_name()!r} cannot serve (an "
                "upstream provider): drop --upstream-url to serve (and train) the embedded model, or choose a "
                "recipe that does not train")
    if ns.print_config:
        print(describe_config(cfg, recipe.config), end="")
        raise SystemExit(0)
    return cfg


def dataclass_parser(cls: type, helps: dict[str, str] | None = None, **kwargs) -> argparse.ArgumentParser:
    """An argparse parser with one flag per field of config dataclass `cls` (`--data_dir` and `--data-dir`), typed by
    the field's annotation, its help text and default shown. Plain argparse: the server's command line needs no
    optional dependency. `helps` replaces a field's help text."""
    import types
    import typing

    p = _Parser(**kwargs)
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        tp = hints[f.name]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        names = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
        p.add_argument(*names, dest=f.name, type=tp, default=f.default,
                       help=(helps or {}).get(f.name, f.metadata.get("help", "")))
    return p


def _read_config_file(path: str) -> dict:
    data = read_config_file(path, "-c") or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping of option names to values")
    names = {f.name for f in fields(ServeConfig)}
    values = {}
    for k, v in data.items():
        key = k.replace("-", "_")
        if key not in names:
            raise ValueError(f"{path}: unknown option {k!r}; known: {sorted(names)}")
        # a mapping in the file (recipe_config, engine_options) travels as its JSON text, as on the command line
        values[key] = orjson.dumps(v).decode() if isinstance(v, dict) else v
    return values


def _config_fields(cls: type, prefix: str = "") -> list[tuple[str, object, str]]:
    """(dotted key, default, help) of a config dataclass and the dataclasses its nested fields are (a field typed
    with one, or a mapping naming one as `schema`)."""
    import typing

    from reef_lab.schema import config_class

    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else None)
        default = asdict(default) if is_dataclass(default) else default
        schema = f.metadata.get("schema") or config_class(hints.get(f.name))
        if schema is not None:
            schema = schema if is_dataclass(schema) else schema()
            out.append((prefix + f.name, default, _who(f.metadata)))
            out += _config_fields(schema, f"{prefix}{f.name}.")
        else:
            out.append((prefix + f.name, default, _who(f.metadata)))
    return out


def _who(meta) -> str:
    """A field's help and who may set it (reef_lab.schema.check_client_fields)."""
    text = meta.get("help", "")
    if meta.get("operator"):
        return text + " [operator only]"
    return text + (f" [clients: at most {meta['client_max']}]" if "client_max" in meta else "")


def _recipe_help(spec: str) -> str:
    try:
        recipe = load_recipe(spec)
    except ReefError as e:
        return f"recipe {spec!r}: {e.message}"
    if recipe.config is None or not is_dataclass(recipe.config):
        return f"recipe {spec!r} has no config fields"
    lines = [f"config of recipe {spec!r} ({type(recipe.config).__name__}; set them in --recipe-config, a YAML "
             "file or inline YAML, e.g. --recipe-config '{batch_size: 8, trainer: {lr: 1.0e-5}}'):"]
    for key, default, help_text in _config_fields(type(recipe.config)):
        lines.append(f"  {key} (default: {_inline(default)}): {help_text}")
    return "\n".join(lines)


def _inline(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()


def describe_config(cfg: ServeConfig, recipe_config) -> str:
    """The effective configuration as commented YAML: every option and every recipe field, with its help."""
    out = ["# reef_lab deployment: scripts/serve.py -c <this file>"]
    for f in fields(ServeConfig):
        if f.name == "recipe_config":
            out.append(f"# {f.metadata['help']}")
            out.append("recipe_config:" + ("" if recipe_config is not None else " null"))
            if recipe_config is not None:
                out += _describe(recipe_config, "  ")
        elif f.name in ("engine_options", "retain_scenarios"):
            out.append(f"# {f.metadata['help']}")
            value = cfg.engine_settings() if f.name == "engine_options" else _mapping(cfg.retain_scenarios, f.name, "")
            out.append(f"{f.name}: {_inline(value or None)}")
        else:
            out.append(f"# {f.metadata['help']}")
            out.append(f"{f.name}: {_inline(getattr(cfg, f.name))}")
    return "\n".join(out) + "\n"


def _describe(obj, indent: str) -> list[str]:
    from reef_lab.schema import build

    lines = []
    for f in fields(obj):
        value, schema = getattr(obj, f.name), f.metadata.get("schema")
        lines.append(f"{indent}# {f.metadata.get('help', '')}")
        if is_dataclass(value):
            lines.append(f"{indent}{f.name}:")
            lines += _describe(value, indent + "  ")
        elif schema is not None and isinstance(value, dict):
            schema = schema if is_dataclass(schema) else schema()
            lines.append(f"{indent}{f.name}:")
            lines += _describe(build(schema, value, f.name), indent + "  ")
        else:
            lines.append(f"{indent}{f.name}: {_inline(value)}")
    return lines


def tokens_from_env() -> list[str]:
    return [t.strip() for t in os.environ.get("REEF_TOKEN", "").split(",") if t.strip()]
