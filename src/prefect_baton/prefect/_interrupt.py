"""``cancel_on_loss=True``: interrupt a body whose lease was lost.

The lease keeper notices a loss on its heartbeat thread and calls ``on_lost``; these guards
turn that call into an interruption of the body running elsewhere:

- sync body: an asynchronous exception (:class:`LeaseInterrupt`) set on the body's thread
  with ``PyThreadState_SetAsyncExc``; it fires at the thread's next Python bytecode, so a
  blocking C call (``time.sleep(60)``, a socket read) finishes first;
- async body: ``task.cancel()`` scheduled on the body's event loop.

``@leased`` then raises :class:`~prefect_baton.errors.LeaseLostError` (see
:meth:`~prefect_baton.prefect._scope.LeaseScope.finish`).
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["AsyncInterrupt", "Interrupt", "LeaseInterrupt", "SyncInterrupt"]


class LeaseInterrupt(BaseException):
    """Raised inside a body whose lease was lost (``cancel_on_loss=True``).

    A control-flow signal (``BaseException``, so ``except Exception`` in user code does not
    swallow it); ``@leased`` converts it to :class:`LeaseLostError` before it leaves.
    """

    def __init__(self, message: str = "the lease was lost (cancel_on_loss=True)") -> None:
        super().__init__(message)


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class Interrupt(Protocol):
    """What the ``@leased`` core needs of a guard (:class:`SyncInterrupt`,
    :class:`AsyncInterrupt`)."""

    def arm(self, suppress: Callable[[], bool]) -> None:
        """Start guarding the body; ``suppress()`` true means "do not interrupt"."""

    def on_lost(self, keeper: Any) -> None:
        """The keeper's ``on_lost`` callback (runs on the heartbeat thread)."""

    def disarm(self) -> None:
        """Stop guarding (idempotent)."""

    def translate(self, exc: BaseException) -> BaseException:
        """What the body's exception ``exc`` means: :class:`LeaseInterrupt` for the
        guard's own interruption, else ``exc``."""


class SyncInterrupt:
    """Interrupts a sync body on its own thread when the lease is lost."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread_id: int | None = None
        self._suppress: Callable[[], bool] | None = None
        self.fired = False

    def arm(self, suppress: Callable[[], bool]) -> None:
        """Start guarding the calling thread; ``suppress()`` true means "do not interrupt"
        (the lease was handed off)."""
        with self._lock:
            self._thread_id = threading.get_ident()
            self._suppress = suppress

    def on_lost(self, keeper: Any) -> None:
        """The keeper's ``on_lost`` callback (runs on the heartbeat thread)."""
        with self._lock:
            if self._thread_id is None or (self._suppress is not None and self._suppress()):
                return
            self.fired = True
            _set_async_exc(self._thread_id, LeaseInterrupt)

    def disarm(self) -> None:
        """Stop guarding; clears an interruption that was set but not delivered yet."""
        with self._lock:
            if self._thread_id is not None and self.fired:
                _set_async_exc(self._thread_id, None)
            self._thread_id = None

    def translate(self, exc: BaseException) -> BaseException:
        """``exc`` as it is: the interruption is raised as :class:`LeaseInterrupt` itself."""
        return exc


class AsyncInterrupt:
    """Cancels an async body's task on its event loop when the lease is lost."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._suppress: Callable[[], bool] | None = None
        self._armed = False
        self.fired = False

    def arm(self, suppress: Callable[[], bool]) -> None:
        """Start guarding the current task (call on the event loop)."""
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._suppress = suppress
        self._armed = True

    def on_lost(self, keeper: Any) -> None:
        """The keeper's ``on_lost`` callback (runs on the heartbeat thread)."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:  # the loop is closed: the body is over
            pass

    def _cancel(self) -> None:
        if not self._armed or self._task is None:
            return
        if self._suppress is not None and self._suppress():
            return
        self.fired = True
        self._task.cancel("the lease was lost (cancel_on_loss=True)")

    def disarm(self) -> None:
        """Stop guarding (call on the event loop; a second call does nothing)."""
        was_armed, self._armed = self._armed, False
        if was_armed and self.fired and self._task is not None and self._task.cancelling():
            self._task.uncancel()

    def translate(self, exc: BaseException) -> BaseException:
        """Our own cancellation becomes :class:`LeaseInterrupt`; anything else stays."""
        if self.fired and isinstance(exc, asyncio.CancelledError):
            return LeaseInterrupt()
        return exc
