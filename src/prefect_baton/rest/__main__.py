"""Serve the REST API: ``python -m prefect_baton.rest [--host H] [--port P]
[--ledger-url URL] [--redis-url URL]`` (defaults: 127.0.0.1, 8787, ``BATON_LEDGER_URL``,
no Redis). The future ``baton serve`` is meant to call :func:`serve`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = ["main", "serve"]


def serve(
    host: str = "127.0.0.1",
    port: int = 8787,
    ledger_url: str | None = None,
    redis_url: str | None = None,
) -> None:
    """Run the app with uvicorn until interrupted.

    Args:
        host: interface to bind (``str``). port: TCP port (``int``).
        ledger_url, redis_url: passed to :func:`~prefect_baton.rest.app.create_app`.

    Raises:
        ValidationError: a malformed URL. UnavailableError: the ledger cannot be reached.
    """
    import uvicorn

    from .app import create_app

    uvicorn.run(create_app(ledger_url, redis_url), host=host, port=port, log_level="info")


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
