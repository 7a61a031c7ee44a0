"""``baton timeline RESOURCE_TYPE RESOURCE_ID --out FILE``: draw a resource's lease
timeline (:mod:`prefect_baton.timeline`) as SVG or HTML."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from prefect_baton.cli._output import emit_ok
from prefect_baton.cli._state import guard, usage_error
from prefect_baton.errors import NotFoundError
from prefect_baton.timeline import build_timeline, check_timeline_path, write_timeline

__all__ = ["timeline"]


def _since(st_value: str | None) -> datetime | None:
    if st_value is None:
        return None
    at = datetime.fromisoformat(st_value.replace("Z", "+00:00"))
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def timeline(
    ctx: typer.Context,
    resource_type: Annotated[str, typer.Argument(help="Resource type (text, e.g. 'file').")],
    resource_id: Annotated[str, typer.Argument(help="Resource id (text).")],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="File to write (path ending in .svg, .html or .png, in an existing "
            "directory; an existing file is replaced). .png needs the png extra (resvg-py).",
        ),
    ] = Path("timeline.svg"),
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="Only generations and marks from this time on (ISO 8601, e.g. "
            "2026-07-30T10:00:00Z; no offset means UTC).",
        ),
    ] = None,
    width: Annotated[
        int, typer.Option("--width", help="Picture width in pixels (integer, 400 to 10000).")
    ] = 1000,
) -> None:
    """Draw the lease timeline of a resource into a file and print where it is.

    One band per lease generation (epoch and holder), with renewals, takeovers after expiry,
    transfers, handoffs, fenced writes rejected and outcomes with their evidence, read from
    the event stream as this principal may see it: holders, handoff parties and purposes
    of others are hidden unless the role is owner or admin. Exits 2 (VALIDATION_ERROR) for
    a bad extension, --since or --width, .png without the png extra (resvg-py), a --out
    that is a directory or whose directory does not exist, or a file that cannot be written
    (the message names the path and the reason); 5
    (NOT_FOUND) when nothing of the resource is visible (never leased, or another
    organization's) or nothing of it falls in the --since window.
    """
    with guard(ctx, "timeline", reads_only=True, org_reads=True) as st:
        check_timeline_path(out)  # a bad extension or directory fails before the ledger opens
        try:
            start = _since(since)
        except ValueError:
            usage_error(st, "timeline", f"--since must be an ISO 8601 time, got {since!r}")
        tl = build_timeline(st.client(), resource_type, resource_id, since=start)
        if tl.empty:
            raise NotFoundError(tl.empty_reason)
        path = write_timeline(tl, out, width=width)
        emit_ok(
            st.format,
            "timeline",
            "timeline",
            {
                "path": str(path.resolve()),
                "resource_type": tl.resource_type,
                "resource_id": tl.resource_id,
                "generations": len(tl.generations),
                "marks": len(tl.marks),
            },
        )
