"""``baton mcp``: serve the coordination tools to MCP clients over stdio or streamable HTTP."""

from __future__ import annotations

import enum
import signal
from typing import Annotated

import typer

from prefect_baton._exit import exit_code_for_signal
from prefect_baton.cli._state import fail, guard

__all__ = ["Transport", "mcp"]


class Transport(enum.StrEnum):
    """How ``baton mcp`` talks to its clients."""

    stdio = "stdio"
    http = "http"


def mcp(
    ctx: typer.Context,
    transport: Annotated[
        Transport,
        typer.Option(
            "--transport",
            case_sensitive=False,
            help="'stdio' (one client, the process's stdin/stdout, acting as --principal) or "
            "'http' (streamable HTTP at /mcp; each request's bearer key decides the identity).",
        ),
    ] = Transport.stdio,
    host: Annotated[
        str, typer.Option("--host", help="HTTP only: interface to bind (text).")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, help="HTTP only: TCP port (integer).")
    ] = 8788,
) -> None:
    """Serve the MCP tools (leases, checkpoints, handoffs, outcomes) until stopped.

    Over stdio every tool call acts as the global --org/--principal/--role (or BATON_*), like
    every other baton command. Over HTTP those are ignored: each request's
    'Authorization: Bearer' key (created with `baton keys create`) decides
    org, principal and role, and a missing, unknown or revoked key gets HTTP 401. Errors of
    the ledger URL, Redis URL or --host exit before serving (VALIDATION_ERROR, exit 2); a
    ledger that cannot be reached or a port that cannot be bound exits with UNAVAILABLE (11).

    Over stdio, SIGINT (Ctrl-C) or SIGTERM stops reading stdin, waits for the answers of
    the calls already read (at most 60 s; a second signal stops the wait), writes them,
    and exits 130 (SIGINT) or 143 (SIGTERM); stdin closing exits 0 the same way.
    """
    from prefect_baton.mcp import serve_http, serve_stdio

    with guard(ctx, "mcp") as st:
        if transport is Transport.stdio:
            try:
                signum = serve_stdio(st.client())
            except KeyboardInterrupt:  # Ctrl-C before the server watches for it
                signum = signal.SIGINT
            if signum is not None:
                raise typer.Exit(exit_code_for_signal(signum))
            return
        secret = st.settings().redis_url
        redis_url = st.redis_url or (secret.get_secret_value() if secret else None)
        try:
            serve_http(host, port, ledger_url=st.local_ledger_url(), redis_url=redis_url)
        except SystemExit as exc:  # uvicorn could not bind: its own status would read as a code
            if exc.code not in (None, 0):
                fail(st, "mcp", "UNAVAILABLE", f"cannot serve on {host}:{port}; see the log")
