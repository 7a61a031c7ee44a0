"""Serve the REST API: ``python -m prefect_baton.rest [--host H] [--port P]
[--ledger-url URL] [--redis-url URL]`` (defaults: 127.0.0.1, 8787, ``BATON_LEDGER_URL``,
no Redis). ``baton serve`` calls :func:`serve` too.

uvicorn's log lines pass through :class:`RedactKeys`, so a bearer key that a client put
where it does not belong (a URL, a query string) is never written to the log; uvicorn
never logs request headers. They also pass through :class:`RateLimitRepeats`, so a fault
that repeats (file descriptors running out, a database gone) cannot fill the disk. The
connections are served by :class:`~prefect_baton.rest._protocol.GuardedH11Protocol`
(header and body deadlines, a connection cap).
"""

from __future__ import annotations

import argparse
import copy
import logging
import re
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote_plus

__all__ = ["RateLimitRepeats", "RedactKeys", "log_config", "main", "run_app", "serve"]

_SECRET = re.compile(r"bk_[A-Za-z0-9_\-]+|(?i:bearer)(?:\s|%20|\+)+[^\s&\"']+")


_TOKEN = re.compile(r"[^\s?&=/;\"']+")


def _redact_token(match: re.Match[str]) -> str:
    return "[redacted]" if _SECRET.search(unquote_plus(match.group())) else match.group()


def _redact(value: str) -> str:
    value = _SECRET.sub("[redacted]", value)
    if "%" in value:  # a percent-encoded key (``bk%5F...``) in a URL
        value = _TOKEN.sub(_redact_token, value)
    return value


class RedactKeys(logging.Filter):
    """A logging filter that replaces bearer keys (``bk_...``, also percent-encoded in a
    URL) and ``Bearer <token>`` text in a record's message and string arguments with
    ``[redacted]``. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact ``record`` (:class:`logging.LogRecord`) in place; returns ``True``."""
        if isinstance(record.msg, str):
            record.msg = _redact(record.msg)
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


def run_app(app: Any, host: str, port: int) -> None:
    """Serve the ASGI ``app`` with uvicorn on ``host:port`` until interrupted (SIGINT or
    SIGTERM end it cleanly), its log lines passing through :class:`RedactKeys` and
    :class:`RateLimitRepeats`, its connections served by
    :class:`~prefect_baton.rest._protocol.GuardedH11Protocol` (request head within 10 s,
    body within 30 s, idle keep-alive 5 s, at most the file descriptor limit less a
    reserve of connections, ``503`` when every one is busy). The REST API and the MCP
    server over HTTP are both served by it.

    Args:
        app: the ASGI application (FastAPI or Starlette). host: interface to bind
            (``str``). port: TCP port (``int``).

    Raises:
        SystemExit: uvicorn could not bind ``host:port`` (code 1, reason in the log).
    """
    import uvicorn

    from prefect_baton.rest._protocol import ACCEPT_BATCH, MAX_HEAD_BYTES, GuardedH11Protocol

    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="info",
        log_config=log_config(),
        http=GuardedH11Protocol,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        timeout_keep_alive=5,
        backlog=ACCEPT_BATCH,
    )


def serve(
    host: str = "127.0.0.1",
    port: int = 8787,
    ledger_url: str | None = None,
    redis_url: str | None = None,
) -> None:
    """Run the app with uvicorn until interrupted (SIGINT or SIGTERM end it cleanly).

    Args:
        host: interface to bind (``str``; default loopback only). port: TCP port (``int``).
        ledger_url, redis_url: passed to :func:`~prefect_baton.rest.app.create_app`.

    Raises:
        ValidationError: a malformed URL, or a ``host`` that is neither a host name nor an
            IP address (:func:`~prefect_baton.rest._http.check_host`, as ``baton mcp``).
        UnavailableError: the ledger cannot be reached.
        SystemExit: uvicorn could not bind ``host:port`` (code 1, reason in the log).
    """
    from prefect_baton.rest._http import check_host
    from prefect_baton.rest.app import create_app

    check_host(host)
    run_app(create_app(ledger_url, redis_url), host, port)


def main(argv: Sequence[str] | None = None) -> None:
    """Parse ``argv`` (``Sequence[str]``; default ``sys.argv[1:]``) and :func:`serve`."""
    parser = argparse.ArgumentParser(prog="python -m prefect_baton.rest")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--ledger-url", default=None)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    serve(args.host, args.port, args.ledger_url, args.redis_url)


if __name__ == "__main__":
    main()
