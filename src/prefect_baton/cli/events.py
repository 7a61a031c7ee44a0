"""``baton events tail`` (and its alias ``baton events list``): page through (or follow)
the org's event stream."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from typing import Annotated, Any

import typer

from prefect_baton._rules.paging import events_after
from prefect_baton.cli._options import Cursor, poll_interval
from prefect_baton.cli._output import emit_page, visible
from prefect_baton.cli._state import CliState, guard, nothing_found
from prefect_baton.models import Event, wire_time

app = typer.Typer(
    name="events",
    help="Read the event stream of committed transitions (outbox).",
    no_args_is_help=True,
)

EVENT_COLUMNS = ("seq", "kind", "subject", "principal", "occurred_at", "event_id")


def _line(st: CliState, ev: Event) -> str:
    if st.json:
        return json.dumps(ev.model_dump(mode="json"))
    fields = [str(ev.seq), wire_time(ev.occurred_at), ev.kind, ev.subject, ev.principal]
    return "\t".join(visible(f) for f in [*fields, ev.event_id])


def _follow(st: CliState, after: int, limit: int, filters: dict[str, Any], interval: float) -> None:
    b = st.client()
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C must interrupt even when started with SIGINT ignored (background jobs).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        while True:
            batch = b.events.list(after_seq=after, limit=limit, **filters)
            for ev in batch:
                sys.stdout.write(_line(st, ev) + "\n")
                after = ev.seq
            sys.stdout.flush()
            if len(batch) < limit:
                time.sleep(interval)
    except KeyboardInterrupt:
        sys.stdout.flush()
        raise typer.Exit(0) from None


@app.command("tail")
def tail(
    ctx: typer.Context,
    after: Annotated[
        int | None,
        typer.Option(
            "--after",
            help="Start after this sequence number (integer, 0 = from the start; default: "
            "from the start, or from --cursor). Giving --after and --cursor is "
            "VALIDATION_ERROR (exit 2).",
        ),
    ] = None,
    limit: Annotated[
        int,
        typer.Option("--limit", help="At most this many events per page (integer, 1 to 1000)."),
    ] = 100,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep polling for new events and print one plain line each (JSON lines with "
            "--format json) until Ctrl-C.",
        ),
    ] = False,
    kind: Annotated[
        str | None,
        typer.Option("--kind", help="Only events of this kind (text, e.g. 'lease.acquired')."),
    ] = None,
    interval: Annotated[
        float, poll_interval(0.05, "With --follow: the pause between polls when idle")
    ] = 1.0,
    resource_type: Annotated[
        str | None,
        typer.Option(
            "--resource-type",
            help="With --resource-id: only the events of this resource's leases (text, 1 to "
            "256 characters): lease.*, fence.rejected, and handoff.* of handoffs that carried "
            "one. Giving only one of the two is VALIDATION_ERROR.",
        ),
    ] = None,
    resource_id: Annotated[
        str | None,
        typer.Option(
            "--resource-id",
            help="With --resource-type: the id of that resource (text, 1 to 256 characters).",
        ),
    ] = None,
    subject: Annotated[
        str | None,
        typer.Option(
            "--subject",
            help="Only events with exactly this subject (text, 1 to 256 characters: the "
            "subject id of a checkpoint, handoff or outcome).",
        ),
    ] = None,
    cursor: Cursor = None,
) -> None:
    """Show the org's events with sequence number > --after, in commit order.

    Without --follow: one page. The JSON receipt's 'next_after' is the value to pass as
    --after for the next page (with the same filters); its 'next_cursor' (null when no
    event follows) is the --cursor of the next page. As a table, stdout is the table alone
    and the --cursor of the next page, when an event follows, goes to stderr.
    """
    filters: dict[str, Any] = {
        "kind": kind,
        "resource_type": resource_type,
        "resource_id": resource_id,
        "subject": subject,
    }
    action = f"events.{ctx.info_name}"  # events.tail, or events.list (the alias)
    with guard(ctx, action, reads_only=True, org_reads=True) as st:
        start = events_after(after, cursor, name="--after", cursor_name="--cursor")
        if follow:
            st.client().events.list(after_seq=start, limit=limit, **filters)  # validate
            _follow(st, start, limit, filters, interval)
            return
        b = st.client()
        events = b.events.list(after_seq=start, limit=limit, **filters)
        next_after = events[-1].seq if events else start
        emit_page(
            st.format,
            action,
            "events",
            events,
            columns=EVENT_COLUMNS,
            extra={"next_after": next_after},
            empty=nothing_found(ctx, "events", b.org),
        )


app.command(
    "list",
    help="List the org's events: the same command as 'baton events tail', with the same "
    "options and output (the receipt's action is 'events.list'). See 'baton events tail "
    "--help'.",
)(tail)
