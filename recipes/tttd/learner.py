"""TTT-Discover live: a server's scenario with recipe `tttd` runs the discovery loop on its own thread, sampling
through the same gateway as any client (so its rollouts and rewards are the scenario's records).

`mode: auto` starts the run when the scenario's learner is built; `manual` waits for `POST /reef/train`, which
also resumes a stopped run. Reports from clients are stored but do not steer the search: the verifier scores it.
"""

from __future__ import annotations

import logging
import threading

from reef_lab.errors import Conflict
from reef_lab.harness.change_requests import refuse_change
from reef_lab.learning.recipe import LearnContext

from .config import TTTDConfig
from .discover import Discovery

log = logging.getLogger("recipes.tttd")


class TTTDLearner:
    def __init__(self, ctx: LearnContext, config: TTTDConfig):
        self.ctx, self.config = ctx, config
        self.discovery = Discovery(ctx, config, ctx.state_dir)
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        if config.mode in ("auto", "hybrid") and not self.discovery.done:
            self._start()

    def _start(self) -> bool:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return False
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"reef-tttd-{self.ctx.scenario}", daemon=True)
            self._thread.start()
            return True

    def _run(self) -> None:
        try:
            self.discovery.run(stop=self._stop)
            self.last_error = None
        except Exception as e:  # noqa: BLE001 - shown in status; serving goes on
            self.last_error = f"{type(e).__name__}: {e}"
            log.exception("TTT-Discover of %s failed", self.ctx.scenario)

    def on_record(self, record: dict) -> None:
        return None  # the verifier scores the rollouts; client reports are kept as records only

    def request_training(self) -> dict:
        if self.discovery.done:
            raise Conflict(f"scenario {self.ctx.scenario!r} finished its {self.config.steps} TTT-Discover steps; "
                           "create a new scenario to discover again")
        started = self._start()
        return {"started": started, "running": not started, "step": self.discovery.state["step"],
                "steps": self.config.steps}

    def promote(self, candidate: str) -> dict:
        raise Conflict("TTT-Discover publishes its final policy itself; there is no candidate to review")

    def request_change(self, body: dict) -> dict:
        raise refuse_change("tttd")

    def on_rollback(self) -> None:
        return None

    def wait_idle(self, timeout: float | None = None) -> bool:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def status(self) -> dict:
        d = self.discovery
        best = d.archive.best()
        return {"recipe": "tttd", "phase": d.phase, "step": d.state["step"], "steps": self.config.steps,
                "best_reward": best.reward, "best_known": d.problem.best_known(), "archive_size": len(d.archive),
                "running": self._thread is not None and self._thread.is_alive(), "last_error": self.last_error,
                "release": d.state.get("released"), "last_step": d.last_row}

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(600)
        self.discovery.close()
