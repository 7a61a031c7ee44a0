"""One timer thread per process for every lease keeper's heartbeat and renew deadline.

Starting two threads per lease block (a heartbeat and a renew-deadline timer) cost more than
the lease itself inside a Prefect run: ``Thread.start`` waits until the new thread has run,
and inside a run that means waiting for the GIL held by Prefect's own threads. Here a lease
block only adds two entries to a heap (:func:`every`); one daemon thread per process sleeps
until the earliest entry is due and hands each due step to a worker thread, so that a
renewal blocked on the network, or a slow ``on_lost`` callback, never delays another lease's
renewal or renew deadline. Workers are daemon threads started when every one is busy and
ended after a few idle seconds; short blocks that never renew start none.

A step holds its object by a weak reference: it is held strongly only while the step runs,
so an object dropped without being stopped is freed and its chain ends. A ``fork()``-ed
child starts with an empty timer of its own (nothing inherited from the parent runs there).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["every", "forget"]

log = logging.getLogger("prefect_baton.lease")

T = TypeVar("T")

#: Seconds a worker waits for a step before it ends.
_WORKER_IDLE_SECONDS = 5.0
#: Below this many heap entries cancelled entries are not compacted away.
_COMPACT_MIN = 64

#: ``step(obj)`` returns the seconds until it runs again, or ``None`` to end its chain.
Step = Callable[[Any], float | None]


class _Workers:
    """Daemon threads running submitted jobs; a new one starts when none is idle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._jobs: deque[Callable[[], None]] = deque()
        self._idle = 0  # workers waiting for a job

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._jobs.append(job)
            if self._idle >= len(self._jobs):
                self._ready.notify()
                return
        threading.Thread(target=self._work, name="baton-keeper", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._jobs:
                    self._idle += 1
                    woken = self._ready.wait(_WORKER_IDLE_SECONDS)
                    self._idle -= 1
                    if not woken and not self._jobs:
                        return
                job = self._jobs.popleft()
            try:
                job()
            except Exception:  # a step's own errors are its business; keep the worker
                log.exception("lease keeper step failed")
            del job


class _Timer:
    """The heap of due steps and the thread that sleeps until the earliest one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # (due monotonic time, tie-breaker, weak reference to the object, step)
        self._heap: list[tuple[float, int, weakref.ref[Any], Step]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._cancelled = 0
        self.workers = _Workers()

    def at(self, due: float, ref: weakref.ref[Any], step: Step) -> None:
        """Run ``step(ref())`` on a worker at monotonic time ``due`` (unless ``ref`` died)."""
        with self._lock:
            heapq.heappush(self._heap, (due, next(self._seq), ref, step))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="baton-timer", daemon=True)
                self._thread.start()
            elif self._heap[0][0] == due:  # a new earliest entry: the thread sleeps too long
                self._wake.notify()

    def cancelled(self, entries: int, alive: Callable[[Any], bool]) -> None:
        """Note that ``entries`` pending entries will only be discarded when due; once they
        are half the heap, drop every entry whose object is gone or not ``alive``."""
        with self._lock:
            self._cancelled += entries
            if self._cancelled * 2 < len(self._heap) or len(self._heap) < _COMPACT_MIN:
                return
            kept = [entry for entry in self._heap if _alive(entry[2], alive)]
            heapq.heapify(kept)
            self._heap = kept
            self._cancelled = 0

    def _run(self) -> None:
        while True:
            with self._lock:
                while True:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        break
                    self._wake.wait(self._heap[0][0] - now if self._heap else None)
                due = []
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap))
            for _, _, ref, step in due:
                if ref() is not None:
                    self.workers.submit(functools.partial(self._step, ref, step))
            del due

    def _step(self, ref: weakref.ref[Any], step: Step) -> None:
        obj = ref()
        if obj is None:
            return
        wait = step(obj)
        del obj
        if wait is not None:
            self.at(time.monotonic() + wait, ref, step)


def _alive(ref: weakref.ref[Any], alive: Callable[[Any], bool]) -> bool:
    obj = ref()
    return obj is not None and alive(obj)


_timer = _Timer()


def _reset_in_child() -> None:
    global _timer
    _timer = _Timer()


os.register_at_fork(after_in_child=_reset_in_child)


def every(obj: T, first: float, step: Callable[[T], float | None]) -> None:
    """Run ``step(obj)`` on a worker thread ``first`` seconds from now, then again after the
    seconds each run returns, until it returns ``None`` or ``obj`` is freed (``obj`` is held
    by a weak reference between runs).

    Args:
        obj: the object the step acts on (weakly referenceable).
        first: seconds (``float`` >= 0) before the first run.
        step: called with ``obj``; returns the seconds until the next run or ``None``.
    """
    _timer.at(time.monotonic() + first, weakref.ref(obj), step)


def forget(entries: int, alive: Callable[[Any], bool]) -> None:
    """Tell the timer that ``entries`` of its pending steps belong to an object that
    stopped (``alive(obj)`` is false for it now): they end when due, and are compacted away
    earlier when such entries make up half of the heap (a long TTL with many short blocks
    would otherwise keep them for two thirds of the TTL)."""
    _timer.cancelled(entries, alive)
