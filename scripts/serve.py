"""Run the live gateway: `python scripts/serve.py` serves the embedded SmolLM2 on 127.0.0.1:8900.

Flags (or the same names in a YAML file given with -c) choose the address, the data dir, the recipe of new
scenarios, an upstream provider to proxy instead of the embedded model, or another local model; --help lists
them. The Flask app runs under reef_lab's HTTP/1.1 server (server/httpd.py: worker processes sharing the port, a
thread per connection that reads each request whole, with a timeout, before the app runs): one worker process that
holds the engine and the record store, or with --upstream-url one per CPU, the others relaying inference to the
provider and their records to the first (server/workers.py). `--http-server granian` runs it under granian instead
(its single-threaded runtime per worker, "st", the faster of granian's runtimes here), which has no
timeout on request bodies.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from reef_lab.config import parse_serve_config  # noqa: E402
from reef_lab.files import write_json  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    # A module:Class the operator names (--engine, --recipe, tasks, trainers) imports in the worker processes too,
    # which start in the repository root: they get the launching folder and PYTHONPATH, made absolute.
    paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([os.getcwd(), *paths]))
    sys.path[1:1] = [os.getcwd(), *paths]
    cfg = parse_serve_config(argv)
    # The workers read the effective config from a file in the data dir (server/wsgi.py): a config may be 1 MB and
    # one environment variable at most 128 KB, beyond which no worker process could even be started.
    handoff = Path(cfg.data_dir).absolute() / "serve-config.json"
    handoff.parent.mkdir(parents=True, exist_ok=True)
    write_json(handoff, cfg.to_dict(), indent=True)
    os.environ["REEF_LAB_SERVE_CONFIG"] = str(handoff)
    # glibc gives every thread that allocates its own heap (up to 8 per CPU), and a heap keeps what it once held: a
    # worker with a thread per connection crept up under steady load (results/log/soak-notes.md); two
    # heaps kept it flat. The workers are new processes, so they read this as they start.
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    # No HF_HUB_OFFLINE here: local models load with local_files_only, and --hub-repo pushes need the Hub client
    # online (its offline flag blocks every request, pushes included).
    print(f"[serve] starting reef_lab on http://{cfg.host}:{cfg.port} (data dir {cfg.data_dir}); "
          "the model loads before the first request is answered", file=sys.stderr, flush=True)
    if cfg.http_server == "granian":
        from granian import Granian
        from granian.constants import Interfaces

        Granian("server.wsgi:app", address=cfg.host, port=cfg.port, interface=Interfaces.WSGI,
                workers=cfg.worker_count(), blocking_threads=cfg.threads, backlog=2048, log_level=cfg.log_level,
                working_dir=ROOT, respawn_failed_workers=False, runtime_mode="st").serve()
        return
    import logging

    from server import httpd
    from server.common import limits_from

    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    body = limits_from(cfg)
    code = httpd.run("server.wsgi:app", cfg.host, cfg.port, cfg.worker_count(), httpd.ConnectionLimits(
        max_requests=cfg.threads, body_bytes=max(body.body_bytes, body.report_bytes, body.import_bytes),
        header_timeout=cfg.read_timeout, read_timeout=cfg.read_timeout))
    httpd.exit_now(code)  # the workers are gone; the interpreter's teardown would only delay the exit


if __name__ == "__main__":
    main()
