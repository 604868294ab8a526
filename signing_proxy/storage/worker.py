"""``DaemonWorker``: an executor of one daemon thread, for calls that may never return (a hung token).

A ``ThreadPoolExecutor``'s threads are joined when the interpreter exits, so one call stuck in a
token (a network HSM that stopped answering mid-signature) keeps the process alive after SIGTERM,
for ever. A daemon thread is not waited for: the process exits with the call still in it. One
thread, first in first out: calls run one at a time in the order submitted, as on a
``ThreadPoolExecutor(1)`` (``storage.pkcs11`` relies on it: one thread per module).
"""

from __future__ import annotations

import concurrent.futures
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

__all__ = ["DaemonWorker"]

P = ParamSpec("P")
T = TypeVar("T")
_Item = tuple["concurrent.futures.Future[Any]", Callable[[], Any]]


class DaemonWorker(concurrent.futures.Executor):
    """Runs submitted calls in order on one daemon thread, started by the first ``submit``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()  # None: stop
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._shut = False

    def __repr__(self) -> str:
        return f"DaemonWorker({self.name!r})"

    def submit(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._shut:
                raise RuntimeError(f"{self.name}: cannot run a call after shutdown")
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()
            self._queue.put((future, functools.partial(fn, *args, **kwargs)))
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            _run(*item)
            del item  # hold no key object or result until the next call

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more calls; with ``cancel_futures`` those still waiting are cancelled. A call running
        finishes on its own (``wait`` waits for it: never with a token that may hang)."""
        with self._lock:
            self._shut = True
            while cancel_futures:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
            self._queue.put(None)
            thread = self._thread
        if wait and thread is not None:
            thread.join()


def _run(future: concurrent.futures.Future[Any], call: Callable[[], Any]) -> None:
    if not future.set_running_or_notify_cancel():  # cancelled while it waited
        return
    try:
        result = call()
    except BaseException as exc:  # as ThreadPoolExecutor: the caller sees it on the future
        future.set_exception(exc)
    else:
        future.set_result(result)
