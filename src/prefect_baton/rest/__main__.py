"""Serve the REST API: ``python -m prefect_baton.rest [--host H] [--port P]
[--ledger-url URL] [--redis-url URL] [--workers N] [--metrics-port M]`` (defaults: 127.0.0.1, 8787,
``BATON_LEDGER_URL``, no Redis, :func:`default_workers`). ``baton serve`` calls
:func:`serve` too.

uvicorn's log lines pass through :class:`RedactKeys`, so a bearer key that a client put
where it does not belong (a URL, a query string) is never written to the log; uvicorn
never logs request headers. They also pass through :class:`RateLimitRepeats`, so a fault
that repeats (file descriptors running out, a database gone) cannot fill the disk. The
connections are served by :data:`~prefect_baton.rest._protocol.GuardedProtocol` (uvicorn's
``httptools`` protocol, or its ``h11`` one when ``httptools`` is not installed, with header
and body deadlines and a connection cap), on ``uvloop``'s event loop when it is installed.
"""

from __future__ import annotations

import argparse
import copy
import functools
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, NoReturn
from urllib.parse import unquote_plus

__all__ = [
    "MAX_WORKERS",
    "RateLimitRepeats",
    "RedactKeys",
    "check_metrics_dir",
    "check_metrics_port",
    "default_workers",
    "log_config",
    "main",
    "run_app",
    "serve",
    "supervise",
    "uvicorn_options",
]

_SECRET = re.compile(r"bk_[A-Za-z0-9_\-]+|(?i:bearer)(?:\s|%20|\+)+[^\s&\"']+")


_TOKEN = re.compile(r"[^\s?&=/;\"']+")


#: How many times a URL token is percent-decoded before it is redacted unread.
_DECODE_ROUNDS = 16


def _redact_token(match: re.Match[str]) -> str:
    """``[redacted]`` for a token of a URL holding a key once fully percent-decoded
    (decoded again until nothing changes: ``bk%5F...``, ``bk%255F...``, any depth), and for
    one still changing after :data:`_DECODE_ROUNDS` decodings; else the token."""
    token = match.group()
    text = token
    for _ in range(_DECODE_ROUNDS):
        decoded = unquote_plus(text)
        if decoded == text:
            return "[redacted]" if _SECRET.search(text) else token
        text = decoded
    return "[redacted]"


def _redact(value: str) -> str:
    value = _SECRET.sub("[redacted]", value)
    if "%" in value:  # a percent-encoded key (``bk%5F...``, ``bk%255F...``) in a URL
        value = _TOKEN.sub(_redact_token, value)
    return value


#: A record's message is mostly a template that repeats (the access log's, every request).
_redact_message = functools.lru_cache(maxsize=512)(_redact)


class RedactKeys(logging.Filter):
    """A logging filter that replaces bearer keys (``bk_...``, also percent-encoded in a
    URL, once or more) and ``Bearer <token>`` text in a record's message and string arguments with
    ``[redacted]``. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact ``record`` (:class:`logging.LogRecord`) in place; returns ``True``."""
        if isinstance(record.msg, str):
            record.msg = _redact_message(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact(a) if isinstance(a, str) else a for a in record.args)
        return True


class RateLimitRepeats(logging.Filter):
    """A logging filter that lets through at most ``burst`` records of one kind (logger,
    level and message template) per ``window_seconds``; when a window that dropped records
    ends, the next record of that kind says how many were dropped. Thread-safe.

    Args:
        burst: records of one kind let through per window (``int``).
        window_seconds: the window (``float``, seconds).
    """

    def __init__(self, burst: int = 5, window_seconds: float = 10.0) -> None:
        super().__init__()
        self.burst = burst
        self.window = window_seconds
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int, str], list[float]] = {}  # [window start, count]

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether to emit ``record`` (:class:`logging.LogRecord`); a record let through
        after drops gets ``(N similar messages suppressed)`` appended."""
        kind = (record.name, record.levelno, str(record.msg)[:200])
        now = time.monotonic()
        with self._lock:
            entry = self._seen.get(kind)
            if entry is None or now - entry[0] >= self.window:
                dropped = int(entry[1]) - self.burst if entry is not None else 0
                if len(self._seen) > 1000:
                    self._seen.clear()
                self._seen[kind] = [now, 1.0]
                if dropped > 0 and isinstance(record.msg, str):
                    record.msg = f"{record.msg} ({dropped} similar messages suppressed)"
                return True
            entry[1] += 1
            return entry[1] <= self.burst


def log_config() -> dict[str, Any]:
    """uvicorn's default logging configuration (``dict`` for :func:`logging.config.dictConfig`)
    with :class:`RedactKeys` on every handler, :class:`RateLimitRepeats` on all but the
    access log's, and the
    ``asyncio`` and ``prefect_baton`` loggers (e.g. ``EMFILE`` on accept, a tool's failure)
    written by uvicorn's error handler through the same filters."""
    from uvicorn.config import LOGGING_CONFIG

    cfg: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    filters = cfg.setdefault("filters", {})
    filters["redact_keys"] = {"()": RedactKeys}
    filters["rate_limit"] = {"()": RateLimitRepeats}
    for name, handler in cfg.get("handlers", {}).items():
        # Access lines share one template: they are redacted, never rate limited.
        extra = ["redact_keys"] if name == "access" else ["rate_limit", "redact_keys"]
        handler.setdefault("filters", []).extend(extra)
    for name in ("asyncio", "prefect_baton"):
        cfg["loggers"][name] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return cfg


#: The most worker processes :func:`serve` runs (``--workers``): 16 times the 4 that
#: :func:`default_workers` picks at most, far past where more processes stop helping
#: (``benchmarks/README.md``), and few enough that a typo (``--workers 1000``) cannot
#: exhaust the machine's memory or process table.
MAX_WORKERS = 64

#: Seconds a worker process may take to start (and to answer its supervisor's ping).
WORKER_START_SECONDS = 60

#: The import string of the app of one worker process
#: (:func:`prefect_baton.rest._worker.worker_app`).
WORKER_APP = "prefect_baton.rest._worker:worker_app"


def uvicorn_options(workers: int = 1) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.run`` / ``uvicorn.Config`` (``dict``) that every
    server of this package shares (see :func:`run_app`), without host, port or app. The
    protocol is named by import string, so a supervisor process that builds its
    ``Config`` never loads the protocol module and the app behind it.

    Args:
        workers: worker processes (``int`` >= 1; over 1 the app must be a factory's
            import string).
    """
    from prefect_baton.rest._limits import ACCEPT_BATCH, MAX_HEAD_BYTES

    return {
        "log_level": "info",
        "log_config": log_config(),
        "http": "prefect_baton.rest._protocol:GuardedProtocol",
        "h11_max_incomplete_event_size": MAX_HEAD_BYTES,  # the h11 fallback's head limit
        "loop": "auto",  # uvloop when installed
        # No route is a WebSocket: an Upgrade request is served as plain HTTP (auth, JSON
        # errors) instead of reaching a WebSocket handshake's plain-text 400 or empty 403.
        "ws": "none",
        "timeout_keep_alive": 5,
        "backlog": ACCEPT_BATCH,
        "workers": workers,
        "factory": workers > 1,
        # A worker that has not answered the supervisor's ping by then is replaced; uvicorn's
        # 5 s are shorter than a worker's start (imports, the app) on a loaded machine.
        "timeout_worker_healthcheck": WORKER_START_SECONDS,
    }


def run_app(app: Any, host: str, port: int, workers: int = 1) -> None:
    """Serve the ASGI ``app`` with uvicorn on ``host:port`` until interrupted (SIGINT or
    SIGTERM end it cleanly), its log lines passing through :class:`RedactKeys` and
    :class:`RateLimitRepeats`, its connections served by
    :data:`~prefect_baton.rest._protocol.GuardedProtocol` (``httptools``, else ``h11``;
    ``uvloop``'s event loop when installed, else asyncio's; request head within 10 s,
    body within 30 s, idle keep-alive 5 s, at most the file descriptor limit less a
    reserve of connections per process, ``503`` when every one is busy; no WebSocket
    upgrade: such a request is answered as a plain one). The REST API and the MCP server
    over HTTP are both served by it.

    Args:
        app: the ASGI application (FastAPI or Starlette), or with ``workers`` over 1 the
            import string of a factory that builds it in each worker process
            (``"module:function"``). host: interface to bind (``str``). port: TCP port
            (``int``). workers: processes accepting on the one listening socket (``int``;
            uvicorn's supervisor starts them, restarts one that dies, and stops them all
            on SIGINT or SIGTERM).

    Raises:
        SystemExit: uvicorn could not bind ``host:port`` (code 1, reason in the log).
    """
    import uvicorn

    uvicorn.run(app, host=host, port=port, **uvicorn_options(workers))


def _exec_supervisor(host: str, port: int, workers: int) -> NoReturn:
    """Bind ``host:port`` here, then replace this process (same process id, same
    environment) with :func:`supervise`, which inherits the bound socket. Never returns.

    Raises:
        SystemExit: the address cannot be bound (code 1, reason in the log), before the
            process is replaced, so the caller reports it as before.
    """
    import uvicorn

    sock = uvicorn.Config(
        WORKER_APP, host=host, port=port, **uvicorn_options(workers)
    ).bind_socket()
    # -P and this process's own sys.path: ``python -c`` would put the working directory
    # first, so a ``tempfile.py`` or ``uvicorn/`` there would be imported in its place.
    code = (
        f"import sys; sys.path[:] = {sys.path!r}; "
        "from prefect_baton.rest.__main__ import supervise; supervise()"
    )
    argv = [sys.executable, "-P", "-c", code, host, str(port), str(workers), str(sock.fileno())]
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()  # flush the log handlers (the "running on" line) before the exec
    os.execv(sys.executable, argv)


def supervise(argv: Sequence[str] | None = None) -> None:
    """The supervisor of :func:`serve` with several workers, run by
    :func:`_exec_supervisor` in place of the process that checked the URLs and migrated
    the ledger: it loads only the standard library, uvicorn and this module (not the
    stores, FastAPI or the client), starts ``workers`` processes that accept on the
    inherited listening socket, restarts one that dies, and on SIGINT or SIGTERM stops
    them all and returns.

    ``PROMETHEUS_MULTIPROC_DIR`` is set here (to a new temporary directory, removed at
    exit) when it is not set already, before the workers start, so each worker's metrics
    land there and every read of ``/metrics`` sums them.

    Args:
        argv: ``[host, port, workers, fd]`` (``Sequence[str]``; default ``sys.argv[1:]``):
            the bound address, the worker count and the listening socket's file descriptor.
    """
    import shutil
    import socket
    import tempfile

    import uvicorn
    from uvicorn.supervisors import Multiprocess

    host, port, workers, fd = argv if argv is not None else sys.argv[1:]
    n = int(workers)
    sock = socket.socket(fileno=int(fd))
    made_dir = None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        made_dir = os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(
            prefix="baton-metrics-"
        )
    try:
        config = uvicorn.Config(WORKER_APP, host=host, port=int(port), **uvicorn_options(n))
        try:
            Multiprocess(config, sockets=[sock]).run()
        except KeyboardInterrupt:
            pass
    finally:
        if made_dir is not None:
            shutil.rmtree(made_dir, ignore_errors=True)


def default_workers(ledger_url: str | None, redis_url: str | None) -> int:
    """The worker processes ``baton serve`` runs when not told (``int``), chosen from the
    measurements in ``benchmarks/README.md`` (issue #16): with Redis as the lease
    authority, one per CPU (at most 4): requests are CPU-bound in Python and Redis takes
    them in parallel; on a SQLite ledger as the authority, 1: SQLite takes one writer at a
    time, and a second process contending for its lock made pairs no faster and latency
    worse; on PostgreSQL, one per CPU (at most 4).

    Args:
        ledger_url: the ledger's URL (``str`` or ``None``: ``BATON_LEDGER_URL``).
        redis_url: the Redis URL (``str`` or ``None``: ``BATON_REDIS_URL``).
    """
    from prefect_baton._settings import load_settings

    s = load_settings()
    cpus = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    if redis_url or s.redis_url is not None:
        return cpus
    url = ledger_url or s.ledger_url
    return 1 if url.startswith("sqlite") else cpus


def check_metrics_port(metrics_port: object, port: int) -> int | None:
    """The ``--metrics-port`` of :func:`serve`: ``None``, or an integer from 1 to 65535
    other than the API's ``port``.

    Raises:
        ValidationError: anything else.
    """
    from prefect_baton.errors import ValidationError

    if metrics_port is None:
        return None
    if (
        isinstance(metrics_port, bool)
        or not isinstance(metrics_port, int)
        or not 1 <= metrics_port <= 65535
    ):
        raise ValidationError(
            f"--metrics-port must be an integer from 1 to 65535, got {metrics_port!r}"
        )
    if metrics_port == port:
        raise ValidationError(
            f"--metrics-port must differ from --port (both {port}): the metrics listener is "
            "a separate socket on 127.0.0.1"
        )
    return metrics_port


def check_metrics_dir() -> None:
    """Check ``PROMETHEUS_MULTIPROC_DIR`` when it is set: prometheus_client's multiprocess
    mode writes each process's values there, so it must be an existing directory this
    process may write in.

    Raises:
        ValidationError: it is set to anything else (a missing path, a file, a directory
            without write permission).
    """
    from prefect_baton.errors import ValidationError

    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path and not (os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)):
        raise ValidationError(
            f"PROMETHEUS_MULTIPROC_DIR={path!r} is not a directory this process can write "
            "in; create it, or unset it (with --workers over 1 a temporary one is made)"
        )


def serve(
    host: str = "127.0.0.1",
    port: int = 8787,
    ledger_url: str | None = None,
    redis_url: str | None = None,
    workers: int | None = None,
    metrics_port: int | None = None,
) -> None:
    """Run the app with uvicorn until interrupted (SIGINT or SIGTERM end it cleanly).

    With more than one worker, the app is first built here (URLs and settings checked,
    the ledger migrated) and closed; then ``ledger_url`` and ``redis_url`` are put in
    ``BATON_LEDGER_URL`` and ``BATON_REDIS_URL`` for the worker processes, each of which
    builds its own (:func:`~prefect_baton.rest._worker.worker_app`) and accepts on the one
    listening socket. Their metrics are then prometheus_client's multiprocess values:
    ``PROMETHEUS_MULTIPROC_DIR`` is set (to a new temporary directory, removed at exit,
    unless already set) before the workers start, and every read of ``/metrics`` sums the
    counters of all workers.
    Without ``metrics_port`` (on a POSIX system), this process then binds the address and
    replaces itself (same process id) with the lean supervisor :func:`supervise`, which
    holds none of the stores and libraries loaded for the checks (about 25 MB of memory
    instead of about 100 MB); with ``metrics_port`` it stays as it is, serving the
    metrics listener from its own store.

    Args:
        host: interface to bind (``str``; default loopback only). port: TCP port (``int``).
        ledger_url, redis_url: passed to :func:`~prefect_baton.rest.app.create_app`.
        workers: worker processes (``int``, 1 to :data:`MAX_WORKERS`, 64; default
            :func:`default_workers`). Each ends when its supervisor does, even one killed
            by SIGKILL; one that cannot build its app tries again, pausing up to 30 s
            (:func:`~prefect_baton.rest._worker.worker_app`).
        metrics_port: also serve the metrics of every organization, unauthenticated, on
            ``127.0.0.1:metrics_port`` (``int``, 1..65535, not ``port``; ``None``: only
            the authenticated ``/metrics`` route), from this process.

    Raises:
        ValidationError: ``workers`` outside 1..:data:`MAX_WORKERS`, a malformed URL, a
            ``host`` that is neither a host name nor an IP address
            (:func:`~prefect_baton.rest._http.check_host`, as ``baton mcp``), a bad
            ``metrics_port`` (:func:`check_metrics_port`), or a ``PROMETHEUS_MULTIPROC_DIR``
            that is not a writable directory (:func:`check_metrics_dir`).
        UnavailableError: the ledger cannot be reached, or ``metrics_port`` cannot be bound.
        SystemExit: uvicorn could not bind ``host:port`` (code 1, reason in the log).
    """
    import shutil
    import tempfile

    from prefect_baton.errors import ValidationError
    from prefect_baton.rest._http import check_host
    from prefect_baton.rest.app import create_app

    check_host(host)
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise ValidationError(f"workers must be from 1 to {MAX_WORKERS}, got {workers} (--workers)")
    metrics_port = check_metrics_port(metrics_port, port)
    check_metrics_dir()
    n = workers if workers is not None else default_workers(ledger_url, redis_url)
    lean = n > 1 and metrics_port is None and os.name == "posix"
    made_dir = None
    if n > 1 and not lean and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        made_dir = os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(
            prefix="baton-metrics-"
        )
    try:
        app = create_app(ledger_url, redis_url)
        listener = None
        if metrics_port is not None:
            from prefect_baton.metrics._prom import listen

            try:
                listener = listen(metrics_port, app.state.store, app.state.authority)
            except BaseException:
                app.state.close_stores()
                raise
        try:
            if n == 1:
                run_app(app, host, port)
                return
            if listener is None:
                app.state.close_stores()  # checked and migrated; each worker opens its own
            for name, value in (("BATON_LEDGER_URL", ledger_url), ("BATON_REDIS_URL", redis_url)):
                if value is not None:
                    os.environ[name] = value
            if lean:
                _exec_supervisor(host, port, n)
            run_app(WORKER_APP, host, port, workers=n)
        finally:
            if listener is not None:
                listener.close()
                if n > 1:
                    app.state.close_stores()
    finally:
        if made_dir is not None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            shutil.rmtree(made_dir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> None:
    """Parse ``argv`` (``Sequence[str]``; default ``sys.argv[1:]``) and :func:`serve`.

    Raises:
        SystemExit: a bad option (code 2, argparse's usage message); a
            :class:`~prefect_baton.errors.BatonError` from :func:`serve`, written as one
            line ``python -m prefect_baton.rest: CODE: message`` on stderr, with the exit
            status ``baton`` gives that code (``VALIDATION_ERROR`` 2, ``UNAVAILABLE`` 11;
            :data:`prefect_baton._exit.EXIT_CODES`); uvicorn could not bind the port
            (code 1, reason in the log).
    """
    from prefect_baton.errors import BatonError

    parser = argparse.ArgumentParser(prog="python -m prefect_baton.rest")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--ledger-url", default=None)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--metrics-port", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        serve(
            args.host, args.port, args.ledger_url, args.redis_url, args.workers, args.metrics_port
        )
    except BatonError as exc:
        from prefect_baton._exit import error_line, exit_code_for

        sys.stderr.write(error_line(parser.prog, exc.to_dict()))
        raise SystemExit(exit_code_for(exc.code)) from None


if __name__ == "__main__":
    # Run as ``python -m``, this file is ``__main__``: take the classes the log
    # configuration names from the module itself, so worker processes can unpickle them.
    from prefect_baton.rest.__main__ import main as _main

    _main()
