"""What the weight learner (reef_lab.learning.learner) and the harness learner (reef_lab.harness_learner) share.

Request threads only queue (a report costs them microseconds); a thread of the scenario's drains the queue and runs a
round when the recipe says one is due (mode auto/hybrid) or a client asked (manual/hybrid, POST /reef/train).
Subclasses say what draining means (`_drain`), when a round is due (`_due`), and run the thread's loop.

The thread lives only while there is work: it starts when something is queued or asked for, and ends after
IDLE_EXIT_S with nothing to do, so an idle scenario holds no thread (issue 50: 600 scenarios of a GEPA deployment
held 1,200 threads). While it lives it looks again every second (a rollback or a release can make a round due).
"""

from __future__ import annotations

import threading
import time
from collections import deque

from reef_lab.errors import Conflict

IDLE_EXIT_S = 10.0  # a learner's thread ends after this long with nothing to do


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
        """Ready to run under thread name `name`; a thread starts now only if work is waiting (a replay)."""
        self._thread_name, self._thread = name, None
        with self._cv:
            if self._inbox or self._manual:
                self._wake()

    def _wake(self) -> None:
        """Lock held: there is work; the thread sees it, started if none runs."""
        self._cv.notify()
        if self._thread is None and not self._stop:
            self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
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
            self._wake()

    def _wait_for_round(self) -> bool:
        """Lock held: wait until a round is asked for or due; False when the thread is to end (the learner is
        closing, or nothing was to do for IDLE_EXIT_S: `_wake` starts another when work comes)."""
        idle_since = time.monotonic()
        while not self._stop:
            self._drain()
            if self._manual or self._due():
                return True
            if time.monotonic() - idle_since >= IDLE_EXIT_S:
                break
            self._cv.wait(timeout=1.0)
        self._thread = None
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
            self._wake()
            return {"scenario": self.scenario, "queued": True, **details}

    def close(self, timeout: float = 60.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
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
