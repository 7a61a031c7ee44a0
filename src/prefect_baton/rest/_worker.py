"""The worker processes of ``baton serve --workers N`` (:func:`prefect_baton.rest.__main__.serve`):
the app each builds (:func:`worker_app`, a uvicorn factory), retried with backoff while it
cannot be built, and the worker's end with its supervisor.

Imported only in the workers: the supervisor (``supervise``) names :func:`worker_app` by
import string and loads none of this.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["PARENT_POLL_SECONDS", "WORKER_RETRY_MAX_SECONDS", "worker_app"]

#: Longest pause (seconds) between a worker's attempts to build its app
#: (:func:`_build_with_retries`): the pause starts at 1 s and doubles up to this.
WORKER_RETRY_MAX_SECONDS = 30.0

#: Seconds between the checks of the thread that ends a worker with its parent, where the
#: kernel cannot do it (:func:`_end_with_parent`).
PARENT_POLL_SECONDS = 1.0


def worker_app() -> Any:
    """The app of one worker process of :func:`serve` with several workers (a uvicorn
    factory): :func:`~prefect_baton.rest.app.create_app` over ``BATON_LEDGER_URL`` and
    ``BATON_REDIS_URL``, which :func:`serve` set before starting the workers.

    The worker ends with its supervisor: when the process that started it dies, even by
    SIGKILL, the worker gets SIGTERM and stops as on any SIGTERM (requests in flight
    finish), so no orphaned worker keeps serving on the port (:func:`_end_with_parent`).
    A worker that cannot build its app (the ledger unreachable, say) keeps trying in the
    same process, logging one line per attempt and pausing 1, 2, 4, ... up to
    :data:`WORKER_RETRY_MAX_SECONDS` seconds between attempts
    (:func:`_build_with_retries`); it stays up for its supervisor meanwhile, so it is
    neither restarted in a loop nor in the way of a SIGTERM.

    Raises:
        SystemExit: (code 0) the supervisor is gone already, or SIGTERM or SIGINT
            arrived while waiting to try again.
    """
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid is not None:  # a worker process, not a server
        _end_with_parent(parent.pid)
    from prefect_baton.rest.app import create_app

    return _build_with_retries(create_app)


def _end_with_parent(parent_pid: int) -> None:
    """Have SIGTERM sent to this process when its parent (``parent_pid``, ``int``) ends:
    on Linux by the kernel (``prctl(PR_SET_PDEATHSIG)``), elsewhere by a daemon thread
    that checks ``os.getppid()`` every :data:`PARENT_POLL_SECONDS`.

    Raises:
        SystemExit: (code 0) the parent had ended already.
    """
    if not _set_parent_death_signal(signal.SIGTERM):
        threading.Thread(
            target=_watch_parent, args=(parent_pid,), name="baton-parent-watch", daemon=True
        ).start()
    if os.getppid() != parent_pid:  # it died before the kernel was told to tell us
        raise SystemExit(0)


def _set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send ``signum`` (``int``) to this process when its parent thread
    ends; whether it could (``bool``: ``False`` off Linux or without ``prctl``)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    pr_set_pdeathsig = 1
    args = (pr_set_pdeathsig, signum, 0, 0, 0)
    return int(prctl(*(ctypes.c_ulong(a) for a in args))) == 0


def _watch_parent(parent_pid: int) -> None:
    """Wait until this process's parent is no longer ``parent_pid`` (``int``; it ended and
    the process was adopted), then send SIGTERM to this process."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_SECONDS)
    os.kill(os.getpid(), signal.SIGTERM)


def _build_with_retries(build: Callable[[], Any]) -> Any:
    """What ``build`` returns, calling it again while it fails with
    :class:`~prefect_baton.errors.UnavailableError` (the ledger or Redis cannot be reached
    yet), pausing 1 s, then twice as long each time, up to
    :data:`WORKER_RETRY_MAX_SECONDS`; each such failure is one error line on the
    ``prefect_baton.rest`` logger (its code and message, no traceback).

    Raises:
        BatonError: any other error of prefect-baton (bad settings, say), logged as one
            line: the worker stops, and uvicorn's supervisor with it, as it would without
            retries.
        Exception: any other failure, logged with its traceback.
        SystemExit: (code 0) SIGTERM or SIGINT arrived during a pause.
    """
    from prefect_baton._exit import one_line
    from prefect_baton.errors import BatonError, UnavailableError

    log = logging.getLogger("prefect_baton.rest")
    delay = 1.0
    while True:
        try:
            return build()
        except UnavailableError as exc:
            reason = f"{exc.code}: {exc.message}"
        except BatonError as exc:
            log.error(
                "worker [%d] cannot start: %s", os.getpid(), one_line(f"{exc.code}: {exc.message}")
            )
            raise
        except Exception:
            log.exception("worker [%d] cannot start", os.getpid())
            raise
        log.error(
            "worker [%d] cannot start: %s; trying again in %g s",
            os.getpid(),
            one_line(reason),
            delay,
        )
        if _pause(delay):
            raise SystemExit(0)
        delay = min(delay * 2, WORKER_RETRY_MAX_SECONDS)


def _pause(seconds: float) -> bool:
    """Sleep ``seconds`` (``float``) in the main thread, cut short by SIGTERM or SIGINT
    (their handlers are restored after); whether one of them arrived (``bool``)."""
    stopped: list[int] = []
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = [signal.signal(s, lambda signum, _frame: stopped.append(signum)) for s in signals]
    try:
        deadline = time.monotonic() + seconds
        while not stopped and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))
    finally:
        for s, handler in zip(signals, previous, strict=True):
            signal.signal(s, handler)
    return bool(stopped)
