"""What the weight learner (reef_lab.learning.learner) and the harness learner (reef_lab.harness_learner) share.

Request threads only queue (a report costs them microseconds); one thread per scenario drains the queue and runs a
round when the recipe says one is due (mode auto/hybrid) or a client asked (manual/hybrid, POST /reef/train).
Subclasses say what draining means (`_drain`), when a round is due (`_due`), and run the thread's loop.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from reef_lab.errors import Conflict


class LearnerLoop:
    scenario: str
    config: object  # the recipe's config: `mode` is read here
    tracker = None  # a reef_lab.publishing.tracking.Tracker, closed with the learner

    def _init_loop(self) -> None:
        self._cv = threading.Condition()
        self._inbox: deque = deque()
        self._manual = 0
        self._stop = False
        self.phase, self.last_error, self.rounds = "idle", None, 0

    def _start(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- hooks (lock held) -----------------------------------------------------------------------------------
    def _drain(self) -> None:
        raise NotImplementedError

    def _due(self) -> bool:
        raise NotImplementedError

    def _run(self) -> None:
        raise NotImplementedError

    # ---- shared ----------------------------------------------------------------------------------------------
    def _queue(self, item) -> None:
        with self._cv:
            self._inbox.append(item)
            self._cv.notify()

    def _wait_for_round(self) -> bool:
        """Lock held: wait until a round is asked for or due; False when the learner is closing."""
        while not self._stop:
            self._drain()
            if self._manual or self._due():
                return True
            self._cv.wait(timeout=1.0)
        return False

    def _ask_round(self, auto_refusal: str, check) -> dict:
        """One round on request (POST /reef/train); refused with `auto_refusal` in mode auto. `check()` (lock held,
        queue drained) raises Conflict when there is nothing to learn from yet, else returns the answer's details."""
        if self.config.mode == "auto":
            raise Conflict(auto_refusal)
        with self._cv:
            self._drain()
            details = check()
            self._manual += 1
            self._cv.notify()
            return {"scenario": self.scenario, "queued": True, **details}

    def close(self, timeout: float = 60.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout)
        if self.tracker is not None:
            self.tracker.close()

    def wait_idle(self, timeout: float = 600.0) -> bool:
        """Block until nothing is queued and no round is running or due (tests and experiments)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self._cv:
                self._drain()
                if self.phase == "idle" and not self._inbox and not self._manual and not self._due():
                    return True
            time.sleep(0.05)
        return False
