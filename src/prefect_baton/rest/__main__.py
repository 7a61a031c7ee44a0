"""Serve the REST API: ``python -m prefect_baton.rest [--host H] [--port P]
[--ledger-url URL] [--redis-url URL]`` (defaults: 127.0.0.1, 8787, ``BATON_LEDGER_URL``,
no Redis). ``baton serve`` calls :func:`serve` too.

uvicorn's log lines pass through :class:`RedactKeys`, so a bearer key that a client put
where it does not belong (a URL, a query string) is never written to the log; uvicorn
never logs request headers.
"""

from __future__ import annotations

import argparse
import copy
import logging
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["RedactKeys", "log_config", "main", "run_app", "serve"]

_SECRET = re.compile(r"bk_[A-Za-z0-9_\-]+|(?i:bearer)(?:\s|%20|\+)+[^\s&\"']+")


def _redact(value: str) -> str:
    return _SECRET.sub("[redacted]", value)


class RedactKeys(logging.Filter):
    """A logging filter that replaces bearer keys (``bk_...``) and ``Bearer <token>``
    text in a record's message and string arguments with ``[redacted]``. Never drops a
    record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact ``record`` (:class:`logging.LogRecord`) in place; returns ``True``."""
        if isinstance(record.msg, str):
            record.msg = _redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact(a) if isinstance(a, str) else a for a in record.args)
        return True


def log_config() -> dict[str, Any]:
    """uvicorn's default logging configuration (``dict`` for :func:`logging.config.dictConfig`)
    with :class:`RedactKeys` on every handler."""
    from uvicorn.config import LOGGING_CONFIG

    cfg: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    cfg.setdefault("filters", {})["redact_keys"] = {"()": RedactKeys}
    for handler in cfg.get("handlers", {}).values():
        handler.setdefault("filters", []).append("redact_keys")
    return cfg


def run_app(app: Any, host: str, port: int) -> None:
    """Serve the ASGI ``app`` with uvicorn on ``host:port`` until interrupted (SIGINT or
    SIGTERM end it cleanly), its log lines passing through :class:`RedactKeys`. The REST
    API and the MCP server over HTTP are both served by it.

    Args:
        app: the ASGI application (FastAPI or Starlette). host: interface to bind
            (``str``). port: TCP port (``int``).

    Raises:
        SystemExit: uvicorn could not bind ``host:port`` (code 1, reason in the log).
    """
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="info", log_config=log_config())


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
        ValidationError: a malformed URL. UnavailableError: the ledger cannot be reached.
        SystemExit: uvicorn could not bind ``host:port`` (code 1, reason in the log).
    """
    from prefect_baton.rest.app import create_app

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
