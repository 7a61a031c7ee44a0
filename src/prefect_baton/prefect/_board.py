"""``publish_board()``: a table artifact of the run's current leases and pending handoffs,
with the lease timeline of the leased resources embedded as SVG images
(:mod:`prefect_baton.timeline`)."""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Iterable
from typing import Any

from prefect_baton._client.sync import Baton
from prefect_baton.prefect._context import BatonLike, current_slot, resolve_baton, run_identity
from prefect_baton.prefect._events import can_emit
from prefect_baton.timeline import build_timeline, render_svg

__all__ = ["MAX_BOARD_TIMELINES", "board_rows", "publish_board", "timelines_markdown"]

MAX_BOARD_TIMELINES = 3
"""At most this many timelines are embedded in a board by default (the first leased
resources of its rows), to keep the artifact small."""

log = logging.getLogger("prefect_baton.prefect")


def board_rows(b: Baton) -> list[dict[str, Any]]:
    """One row per effective lease of ``b``'s principal and per pending handoff addressed to
    it: ``kind``, ``what``, ``id``, ``epoch``, ``expires_at`` (ISO 8601 UTC), ``detail``."""
    rows: list[dict[str, Any]] = []
    for lease in b.leases.list(limit=1000):
        rows.append(
            {
                "kind": "lease",
                "what": f"{lease.resource_type}/{lease.resource_id}",
                "id": lease.lease_id,
                "epoch": lease.epoch,
                "expires_at": lease.expires_at.isoformat(timespec="seconds"),
                "detail": lease.purpose or "",
            }
        )
    for h in b.handoffs.inbox(limit=1000):
        rows.append(
            {
                "kind": "handoff (pending)",
                "what": h.subject_id,
                "id": h.handoff_id,
                "epoch": "",
                "expires_at": h.expires_at.isoformat(timespec="seconds") if h.expires_at else "",
                "detail": f"from {h.from_principal}: {h.message or ''}".strip(),
            }
        )
    return rows


def timelines_markdown(b: Baton, resources: Iterable[tuple[str, str]], *, width: int = 800) -> str:
    """Markdown that shows the lease timeline of each ``(resource_type, resource_id)`` as
    ``b`` may see it, embedded as an SVG ``data:`` URI image (no file or server to link
    to), under a bold heading. Resources with nothing visible are left out; ``""`` when
    none is left.

    Args:
        width: picture width in pixels (``int``, 400 to 10,000).

    Raises:
        ValidationError: a bad resource id or width. UnavailableError: the ledger cannot
            be reached.
    """
    parts: list[str] = []
    for rtype, rid in resources:
        tl = build_timeline(b, rtype, rid)
        if tl.empty:
            continue
        data = base64.b64encode(render_svg(tl, width=width).encode("utf-8")).decode("ascii")
        parts.append(
            f"**Lease timeline of `{rtype}/{rid}`** ({len(tl.generations)} generations, "
            f"{len(tl.marks)} marks)\n\n![lease timeline of {rtype}/{rid}]"
            f"(data:image/svg+xml;base64,{data})"
        )
    return "\n\n".join(parts)


def _artifact_key(text: str) -> str:
    key = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (key or "board")[:100]


def publish_board(
    baton: BatonLike | None = None,
    *,
    key: str | None = None,
    description: str | None = None,
    timelines: Iterable[tuple[str, str]] | None = None,
) -> Any:
    """Add a table artifact listing the run's current leases and the pending handoffs
    addressed to it (its principal: the deployment or flow name, see ``run_identity``),
    with the lease timelines of resources embedded under the description
    (:func:`timelines_markdown`).

    Args:
        baton: client or factory (see :func:`leased`); default: the enclosing lease's
            client, else ``Baton.from_settings()`` acting as the run's principal.
        key: artifact key (lowercase letters, digits, dashes; default
            ``baton-board-<principal>``). description: markdown shown with the table.
        timelines: ``(resource_type, resource_id)`` pairs whose timelines to embed;
            default: the resources of the board's leases, at most
            :data:`MAX_BOARD_TIMELINES`; ``()`` embeds none.

    Returns:
        The artifact id (``uuid.UUID``), or ``None`` when skipped: outside a run and without
        ``PREFECT_API_URL`` nothing is published (and no Prefect server is started).

    Raises:
        UnavailableError: the ledger cannot be reached.
    """
    ident = run_identity()
    slot = current_slot()
    b = slot.baton if baton is None and slot is not None else resolve_baton(baton, ident.principal)
    rows = board_rows(b)
    if not can_emit():
        log.info("publish_board: not in a Prefect run and no PREFECT_API_URL; skipped")
        return None
    from prefect.artifacts import create_table_artifact

    if timelines is None:
        leased = [r["what"].split("/", 1) for r in rows if r["kind"] == "lease"]
        timelines = [(t, i) for t, i in leased[:MAX_BOARD_TIMELINES]]
    text = (
        description
        or f"Leases held by `{b.principal}` and handoffs waiting for it ({len(rows)} rows)."
    )
    pictures = timelines_markdown(b, timelines)
    return create_table_artifact(
        table=rows,
        key=_artifact_key(key or f"baton-board-{b.principal}"),
        description=f"{text}\n\n{pictures}" if pictures else text,
    )
