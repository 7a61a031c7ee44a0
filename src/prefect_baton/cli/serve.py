"""``baton serve``: the REST API over HTTP (uvicorn), on loopback by default."""

from __future__ import annotations

from typing import Annotated

import typer

from prefect_baton.cli._state import fail, guard

__all__ = ["serve"]


def serve(
    ctx: typer.Context,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Interface to bind (text). The default serves this machine only; bind "
            "another address only behind TLS.",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, help="TCP port (integer, 1-65535).")
    ] = 8787,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Worker processes (integer, 1-64). Default: one per CPU (at most 4) with "
            "--redis-url or on PostgreSQL, 1 on a SQLite ledger alone (one writer at a "
            "time). A worker ends when the server process does, even one killed by "
            "SIGKILL; one that cannot reach the ledger at start tries again, pausing up to "
            "30 s.",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="Also serve the metrics of every organization, without authentication, on "
            "127.0.0.1 at this TCP port (integer, 1-65535, not --port). Without it, metrics "
            "are only at /metrics on the API port, for a bearer key, of its organization.",
        ),
    ] = None,
) -> None:
    """Serve the REST API (/v1 routes, OpenAPI document at /openapi.json) until stopped.

    The ledger is --ledger-url (or BATON_LEDGER_URL) and, with --redis-url, Redis is the
    lease authority. Every /v1 request needs a bearer key made by 'baton keys create'; the
    key decides org, principal and role, so --org, --principal and --role do not apply.
    Log lines never contain Authorization headers or keys. SIGINT or SIGTERM stop it
    after the requests in flight finish. GET /metrics (any valid key; not in the OpenAPI
    document) shows the Prometheus metrics of the key's organization; with --workers over
    1 they are summed over the workers (prometheus_client's multiprocess mode). Exit
    status: VALIDATION_ERROR (2) for a malformed URL or port, --workers outside 1-64, or a
    PROMETHEUS_MULTIPROC_DIR that is not a writable directory; UNAVAILABLE (11) when the
    ledger cannot be reached or a port cannot be bound.
    """
    with guard(ctx, "serve") as st:
        from prefect_baton.rest.__main__ import serve as run

        try:
            run(host, port, st.local_ledger_url(), st.redis_url, workers, metrics_port)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                fail(st, "serve", "UNAVAILABLE", f"cannot serve on {host}:{port}; see the log")
