"""``baton ui``: the live page (``/ui``) of the REST API on this machine, with nothing to
set up: the same app as ``baton serve``, on a free loopback port, with a bearer key made
for the session and revoked when it ends."""

from __future__ import annotations

import os
import signal
import socket
import sys
import webbrowser
from typing import Annotated

import typer

from prefect_baton.cli._output import emit_ok
from prefect_baton.cli._state import fail, guard
from prefect_baton.cli.keys import key_row

__all__ = ["ui"]


def _free_port() -> int:
    """A TCP port free on 127.0.0.1 now (``int``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ui(
    ctx: typer.Context,
    port: Annotated[
        int,
        typer.Option(
            "--port", min=0, max=65535, help="TCP port on 127.0.0.1 (integer; 0: a free one)."
        ),
    ] = 0,
    open_browser: Annotated[
        bool,
        typer.Option("--open", help="Also open the page in the default web browser."),
    ] = False,
) -> None:
    """Serve the live page of the ledger (effective leases counting down, pending handoffs,
    recent events, reconciler lag) on 127.0.0.1 until stopped, and print its URL.

    The ledger is --ledger-url (or BATON_LEDGER_URL; default the embedded SQLite file
    ./.baton/ledger.db) and, with --redis-url, Redis is the lease authority. A bearer key
    is made for --org and --principal (or BATON_ORG and BATON_PRINCIPAL, default the local
    identity) with --role (default owner, which sees every holder); its secret is printed
    once, with the URL that signs in with it (the key travels in the URL's fragment, which
    a browser never sends to a server); with --format json, as one receipt line (ui.url,
    ui.signed_in_url, the key's ids, and secret). SIGINT, SIGTERM or SIGHUP stop the server and
    revoke the key. No browser is started unless --open is given. Exit status: VALIDATION_ERROR (2)
    for a bad URL, org, principal or role; UNAVAILABLE (11) when the ledger cannot be
    reached or the port cannot be bound.
    """
    with guard(ctx, "ui") as st:
        from prefect_baton.rest.__main__ import run_app
        from prefect_baton.rest.app import create_app
        from prefect_baton.rest.keys import create_key, revoke_key

        ledger_url = st.local_ledger_url()
        principal = st.principal or st.settings().principal
        app = create_app(ledger_url, st.redis_url)
        try:
            secret, key = create_key(
                ledger_url,
                org=st.resolved_org(),
                principal=principal,
                role=st.role or "owner",
            )
        except BaseException:
            app.state.close_stores()
            raise
        chosen = port or _free_port()
        url = f"http://127.0.0.1:{chosen}/ui"
        if st.json:  # the first line of stdout (the access log follows it)
            page = {"url": url, "signed_in_url": f"{url}#key={secret}", **key_row(key)}
            emit_ok(st.format, "ui", "ui", page, extra={"secret": secret})
        else:
            sys.stdout.write(
                f"baton ui: {url}\n"
                f"  key (revoked when this stops): {secret}\n"
                f"  signed in: {url}#key={secret}\n"
                f"  as {key.principal} ({key.role}) in {key.org}; stop with Ctrl-C\n"
            )
        sys.stdout.flush()
        if open_browser:
            webbrowser.open(f"{url}#key={secret}")
        # uvicorn stops on SIGTERM, then raises it again with the handler it found: a
        # handler that does nothing lets this function go on to revoke the key.
        previous = signal.signal(signal.SIGTERM, lambda *_a: None)
        # a closed terminal (SIGHUP) stops the server the same way, so the key is revoked
        hangup = signal.signal(signal.SIGHUP, lambda *_a: os.kill(os.getpid(), signal.SIGTERM))
        try:
            run_app(app, "127.0.0.1", chosen)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                fail(st, "ui", "UNAVAILABLE", f"cannot serve on 127.0.0.1:{chosen}; see the log")
        except KeyboardInterrupt:  # SIGINT raised again by uvicorn after it stopped
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGHUP, hangup)
            revoke_key(ledger_url, key_id=key.key_id)
