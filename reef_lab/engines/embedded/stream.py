"""The handle a caller holds on one embedded generation: text deltas to iterate, the Generation to wait for,
cancel. The scheduler thread (scheduler.py) feeds it; it is the only object both threads touch per request.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from concurrent.futures import CancelledError

from reef_lab.engines.base import ChatRequest, Generation

_END = object()


class EmbeddedStream:
    """The handle `submit` returns. Iterate it (once) for text deltas; `result()` blocks for the Generation.

    An error in the scheduler is raised from both; after `cancel()`, iteration stops and `result()` raises
    `concurrent.futures.CancelledError`.
    """

    def __init__(self, request: ChatRequest, prompt_ids: list[int], release_id: str = "base"):
        self.request = request
        self.prompt_ids = prompt_ids
        self.release_id = release_id
        self._deltas: queue.Queue = queue.Queue()
        self._done = threading.Event()
        self._cancel = threading.Event()
        self._generation: Generation | None = None
        self._error: BaseException | None = None
        self._end_lock = threading.Lock()

    def __iter__(self) -> Iterator[str]:
        while True:
            item = self._deltas.get()
            if item is _END:
                self._deltas.put(_END)  # a second iteration ends at once instead of waiting forever
                if self._error is not None and not isinstance(self._error, CancelledError):
                    raise self._error
                return
            yield item

    def result(self, timeout: float | None = None) -> Generation:
        if not self._done.wait(timeout):
            raise TimeoutError(f"generation not finished after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._generation

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def done(self) -> bool:
        return self._done.is_set()

    # Called by the scheduler thread, and by close() when the scheduler is stuck in a forward pass. The first of
    # _finish/_fail wins; later calls return False.
    def _push(self, delta: str) -> None:
        if delta:
            self._deltas.put(delta)

    def _finish(self, generation: Generation) -> bool:
        return self._end(generation, None)

    def _fail(self, error: BaseException) -> bool:
        return self._end(None, error)

    def _end(self, generation: Generation | None, error: BaseException | None) -> bool:
        with self._end_lock:
            if self._done.is_set():
                return False
            self._generation, self._error = generation, error
            self._done.set()
        self._deltas.put(_END)
        return True
