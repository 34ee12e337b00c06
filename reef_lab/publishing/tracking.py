"""W&B tracking: every experiment and every live training scenario is a W&B run.

The run gets the config from the config dataclasses, a metric per learner event (training step: loss, reward,
masked fraction, value error, staleness, ...; candidate: held-out accuracy with a table of answers; release:
version, swap time and the Hub revision it is pushed to). The learner's local metrics file stays the source the
apps read; W&B is a mirror.

Offline by default: `WANDB_MODE` decides, else online when `WANDB_API_KEY` is set, else offline (runs land in
`<dir>/wandb/offline-run-*`, readable with `wandb leet inspect --json PATH` and uploadable with `wandb sync`).
wandb.init and every log call run in the tracker's own thread from a queue, so a slow or missing network (online
mode can hang about two minutes without one) never blocks training or serving.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path

from reef_lab.extras import need

log = logging.getLogger("reef_lab.publishing.tracking")


@dataclass
class TrackingConfig:
    project: str = field(default="reef_lab", metadata={"help": "W&B project"})
    entity: str | None = field(default=None, metadata={"help": "W&B entity (team or user)"})
    group: str | None = field(default=None, metadata={"help": "W&B group (e.g. an experiment's name)"})
    name: str | None = field(default=None, metadata={"help": "run name (default: the scenario's name)"})
    extra_config: dict = field(default_factory=dict, metadata={"help": "more config recorded on the run"})
    mode: str | None = field(default=None, metadata={
        "help": "offline, online or disabled; default: WANDB_MODE, else online if WANDB_API_KEY is set, else offline"})

    def __post_init__(self) -> None:
        if self.mode not in (None, "offline", "online", "disabled"):
            raise ValueError(f"tracking mode must be offline, online or disabled, got {self.mode!r}")

    def resolved_mode(self) -> str:
        return self.mode or os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY")
                                                             else "offline")


_STOP = object()


class Tracker:
    """One W&B run fed through a queue by its own thread. The run and its thread start with the first row logged,
    so a scenario that never learns holds neither (issue 50: idle scenarios must cost no thread)."""

    def __init__(self, name: str, config: dict, tracking: TrackingConfig, directory: str | Path):
        self.name, self.tracking = name, tracking
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.link: str | None = None  # the run's URL online, its local folder offline
        self.error: str | None = None
        self._queue: queue.Queue = queue.Queue()
        self._ready = threading.Event()
        self._config = config
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _put(self, item) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, args=(self._config,), name=f"reef-wandb-{self.name}",
                                                daemon=True)
                self._thread.start()
        self._queue.put(item)

    def log(self, row: dict) -> None:
        self._put(("log", row))

    def artifact(self, path: str | Path, name: str, kind: str, metadata: dict | None = None) -> None:
        """Log a file as a W&B artifact (a discovered solution, say); its name may hold only W&B's characters."""
        self._put(("artifact", (str(path), name.replace(":", "-"), kind, dict(metadata or {}))))

    def close(self, timeout: float = 60.0) -> None:
        with self._lock:
            thread = self._thread
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(timeout)

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Whether the run started (False as well when nothing was logged yet: it has not)."""
        return self._ready.wait(timeout) if self._thread is not None else False

    def _run(self, config: dict) -> None:
        try:
            need("tracking")
            import wandb

            run = wandb.init(project=self.tracking.project, entity=self.tracking.entity, group=self.tracking.group,
                             name=self.name, config=config, dir=str(self.dir), mode=self.tracking.resolved_mode(),
                             settings=wandb.Settings(silent=True, console="off"), reinit="create_new")
            self.link = run.url or str(Path(run.dir).parent)
            # wandb.init registered an exit handler that ends W&B's service process; the deployment's own close
            # (the learners', then this tracker's) runs after it, so finish() met a dead service and printed a
            # traceback at every clean shutdown. Registered now, after W&B's, this one runs first (exit handlers
            # run last-registered first); a later close() finds the run finished.
            atexit.register(self.close)
        except Exception as e:  # noqa: BLE001 - tracking is a mirror: without it, training and serving go on
            self.error = f"{type(e).__name__}: {e}"
            log.warning("W&B run %s could not start (%s); metrics stay in the local metrics file", self.name,
                        self.error)
            self._ready.set()
            while self._queue.get() is not _STOP:
                pass
            return
        self._ready.set()
        try:
            while (item := self._queue.get()) is not _STOP:
                try:
                    if item[0] == "artifact":
                        path, name, kind, metadata = item[1]
                        art = wandb.Artifact(name, type=kind, metadata=metadata)
                        art.add_file(path)
                        run.log_artifact(art)
                    else:
                        self._write(run, wandb, item[1])
                except Exception as e:  # noqa: BLE001 - one bad row must not end the run
                    log.warning("W&B log of %s failed: %s", self.name, e)
        finally:
            try:
                run.finish()
            except Exception as e:  # noqa: BLE001 - W&B's service already gone (a stop during wandb.init): say so
                log.warning("W&B run %s did not finish cleanly (%s: %s); what it logged stays in %s and the local "
                            "metrics file", self.name, type(e).__name__, e, self.link)

    @staticmethod
    def _write(run, wandb, row: dict) -> None:
        event = row.get("event", "metric")
        prefix = {"step": "train", "candidate": "eval", "release": "release", "eval": "eval"}.get(event, event)
        data = {f"{prefix}/{k}": v for k, v in row.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("time",)}
        if event == "candidate" and row.get("examples"):
            data["eval/answers"] = wandb.Table(columns=["id", "answer", "text", "score"], data=[
                [e["id"], e["answer"], e["text"], e["score"]] for e in row["examples"]])
        if event == "release":
            data["release/version_number"] = int(str(row.get("version", "v0")).lstrip("v") or 0)
            run.summary["release/latest"] = row.get("release_id")
            if row.get("hub_url"):
                run.summary[f"release/{row.get('version')}/hub"] = row["hub_url"]
        if event == "error":
            run.summary["last_error"] = row.get("error")
        if data:
            run.log(data)
