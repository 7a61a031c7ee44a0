"""``baton reconcile [--follow | --return-to-ledger]``: drain the Redis lease journal into
the ledger, or hand an organization's leases back to the ledger."""

from __future__ import annotations

import signal
import sys
import threading
from typing import TYPE_CHECKING, Annotated, Any

import typer

from prefect_baton._stores.redis.keys import DEFAULT_BATCH
from prefect_baton.cli._options import poll_interval
from prefect_baton.cli._output import emit_ok, visible
from prefect_baton.cli._state import guard
from prefect_baton.errors import ValidationError

if TYPE_CHECKING:
    from prefect_baton.reconcile import Lag

__all__ = ["reconcile"]


def _lag(lag: Lag) -> dict[str, Any]:
    return {"entries": lag.entries, "seconds": round(lag.seconds, 3), "oldest_id": lag.oldest_id}


def reconcile(
    ctx: typer.Context,
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep draining until interrupted (a service).")
    ] = False,
    interval: Annotated[
        float,
        poll_interval(
            0.01, "The pause after a round that applied less than one full batch per org"
        ),
    ] = 0.5,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Journal entries per ledger transaction.")
    ] = DEFAULT_BATCH,
    return_to_ledger: Annotated[
        bool,
        typer.Option(
            "--return-to-ledger",
            help="Hand the org's leases (--org, else BATON_ORG) back to the ledger, so "
            "clients without a Redis URL may decide them again.",
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="With --return-to-ledger: hand back also when this Redis has no state for "
            "the org and the ledger names another Redis as the org's (only when that Redis "
            "is gone for good).",
        ),
    ] = False,
) -> None:
    """Drain the Redis lease journal into the ledger and report the lag.

    Drains the org of --org when given, else every org that used Redis. Needs a Redis URL
    (--redis-url or BATON_REDIS_URL). With --follow it runs until SIGINT or SIGTERM.

    Once a client with a Redis URL has used an org, the ledger refuses to decide that
    org's leases for clients without one (FORBIDDEN, exit 6): the ledger's copy lags
    Redis. With --return-to-ledger the org's Redis operations stop (they fail closed), the
    journal is drained, and the ledger decides the org's leases again; a Redis client that
    uses the org later rebuilds its state from the ledger and takes the org back. Output:
    the org and whether Redis decided it until now (returned).

    The ledger records which Redis server decides an org: a client whose Redis has no
    state for the org and is another server (a wrong BATON_REDIS_URL) is refused
    (FORBIDDEN) instead of rebuilding it as after a data loss, and --return-to-ledger
    through such a Redis is refused too unless --force says the org's Redis is gone.
    """
    if return_to_ledger:
        _return_to_ledger(ctx, follow, force)
        return
    with guard(ctx, "reconcile") as st:
        if force:
            raise ValidationError("--force goes with --return-to-ledger")
        from prefect_baton.reconcile import run_reconciler  # Redis and the drivers, only here

        secret = st.settings().redis_url
        redis_url = st.redis_url or (secret.get_secret_value() if secret else None)
        stop = threading.Event()
        handlers: dict[signal.Signals, Any] = {}
        if follow and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                handlers[sig] = signal.signal(sig, lambda *_a: stop.set())

        bar: Any = None
        if not st.json and sys.stderr.isatty():  # a live line on a terminal, plain when piped
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn

            bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}", markup=False),
                console=Console(stderr=True),
            )
            bar.start()
            task = bar.add_task("reconcile: waiting for journal entries")

        def progress(org: str, applied: int, lag: Lag) -> None:
            line = (
                f"reconcile: {visible(org)}: applied {applied}, lag {lag.entries} entries "
                f"/ {lag.seconds:.3f} s"
            )
            if bar is not None:
                bar.update(task, description=line)
            elif not st.json:
                sys.stderr.write(line + "\n")

        try:
            report = run_reconciler(
                redis_url,
                st.local_ledger_url(),
                orgs=[st.org] if st.org else None,
                follow=follow,
                interval_seconds=interval,
                batch_size=batch_size,
                stop=stop,
                on_batch=progress,
            )
        finally:
            if bar is not None:
                bar.stop()
            for sig, old in handlers.items():
                signal.signal(sig, old)
        data = {
            "orgs": report.orgs,
            "applied": report.applied,
            "lag": {org: _lag(lag) for org, lag in report.lag.items()},
        }
        emit_ok(st.format, "reconcile", "reconcile", data)


def _return_to_ledger(ctx: typer.Context, follow: bool, force: bool) -> None:
    """``baton reconcile --return-to-ledger``: see :func:`reconcile`."""
    with guard(ctx, "reconcile") as st:
        from prefect_baton._rules.validation import validate_id
        from prefect_baton._stores.ledger.engine import require_ledger_file
        from prefect_baton._stores.ledger.store import LedgerStore
        from prefect_baton._stores.redis.authority import RedisAuthority
        from prefect_baton._stores.redis.base import options_from

        if follow:
            raise ValidationError("give --follow or --return-to-ledger, not both")
        settings = st.settings()
        secret = settings.redis_url
        redis_url = st.redis_url or (secret.get_secret_value() if secret else None)
        if not redis_url:
            raise ValidationError("no Redis URL: pass --redis-url or set BATON_REDIS_URL")
        org = validate_id("org", st.resolved_org())
        options = options_from(settings)  # the BATON_REDIS_* settings, before a ledger opens
        ledger_url = st.local_ledger_url()
        # the org goes back to the ledger its clients wrote, never to a new, empty file
        require_ledger_file(ledger_url, configured_by="--ledger-url (or BATON_LEDGER_URL)")
        ledger = LedgerStore.from_settings(settings, ledger_url)
        try:
            auth = RedisAuthority.from_url(redis_url, ledger, **options)
            try:
                returned = auth.return_to_ledger(org, force=force)
            finally:
                auth.close()
        finally:
            ledger.close()
        emit_ok(st.format, "reconcile", "reconcile", {"org": org, "returned": returned})
