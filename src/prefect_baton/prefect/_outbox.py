"""In-run Prefect events handed to Prefect on a thread of their own, in order.

Building a Prefect event (``prefect.events.emit_event``: the model's validation, its size,
the events worker's queue) costs about 0.2 ms, twice per ``@leased`` task (acquired and
released), which is most of what a lease adds to a task on Redis. The run's thread only
queues the call with its context (:func:`later`); one daemon thread per process makes it,
in the order queued, inside that context (so Prefect still relates the event to the run
that queued it).

At interpreter exit the queue is flushed before Prefect's events worker drains (for up to
:data:`FLUSH_SECONDS`); a ``fork()``-ed child starts with an empty queue of its own. Events
are a mirror of the ledger: one lost in a crash is still delivered by
:func:`~prefect_baton.prefect.relay_events`.
"""

from __future__ import annotations

import contextvars
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["FLUSH_SECONDS", "flush", "later"]

log = logging.getLogger("prefect_baton.prefect.events")

#: The longest the exit flush waits for queued events (seconds).
FLUSH_SECONDS = 10.0


class _Outbox:
    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[contextvars.Context, Callable[[], Any], str]] = queue.Queue()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def put(self, call: Callable[[], Any], what: str) -> None:
        if self.thread is None:
            with self.lock:
                if self.thread is None:
                    _register_exit_flush()
                    self.thread = threading.Thread(
                        target=self._run, name="baton-events", daemon=True
                    )
                    self.thread.start()
        self.queue.put((contextvars.copy_context(), call, what))

    def _run(self) -> None:
        while True:
            context, call, what = self.queue.get()
            try:
                context.run(call)
            except Exception:
                log.warning("could not emit Prefect event %s", what, exc_info=True)
            finally:
                self.queue.task_done()
            del context, call

    def flush(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True


def _register_exit_flush() -> None:
    """Flush at exit before Prefect's events worker drains: Prefect drains it from
    ``threading``'s exit hooks, which run last-registered first, so the worker is made
    (registering its hook) before this hook is registered."""
    try:
        from prefect.events.worker import EventsWorker, should_emit_events

        if should_emit_events():
            EventsWorker.instance()
    except Exception:  # no worker to order against: flush anyway
        log.debug("no Prefect events worker to flush before", exc_info=True)
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - CPython has it since 3.9
        import atexit

        register = atexit.register
    try:
        register(lambda: flush(FLUSH_SECONDS))
    except RuntimeError:  # the interpreter is already shutting down
        log.debug("too late to flush Prefect events at exit", exc_info=True)


_outbox = _Outbox()


def _reset_in_child() -> None:
    global _outbox
    _outbox = _Outbox()


os.register_at_fork(after_in_child=_reset_in_child)


def later(call: Callable[[], Any], what: str) -> None:
    """Run ``call()`` (which emits a Prefect event) on the events thread, in the order
    queued, inside a copy of the caller's context. An exception it raises is logged as a
    warning (``what`` names the event).

    Args:
        call: the emission, no arguments.
        what: the event's kind, for the warning.
    """
    _outbox.put(call, what)


def flush(timeout: float = FLUSH_SECONDS) -> bool:
    """Wait until every event queued so far was handed to Prefect's events worker.

    Args:
        timeout: the longest to wait (``float`` seconds).

    Returns:
        ``True`` when the queue is empty, ``False`` when ``timeout`` passed first.
    """
    return _outbox.flush(timeout)
