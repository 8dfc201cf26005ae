"""One daemon thread running submitted jobs in order, each with its ``Future``.

``ThreadPoolExecutor(max_workers=1)`` would do, but the interpreter joins its threads at exit:
a prefetch waiting for memory that an interrupted forward never hands back (a
``KeyboardInterrupt`` skips the hooks that would) would then hold the exit up for good. A daemon
thread is left behind instead; whatever it was doing is of no use once the process ends.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["JobThread"]

T = TypeVar("T")


class JobThread:
    """Runs ``submit``-ted calls one after the other on its own daemon thread."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((future, fn, args))
        return future

    def shutdown(self) -> None:
        """Run what was submitted, then end the thread."""
        self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)
