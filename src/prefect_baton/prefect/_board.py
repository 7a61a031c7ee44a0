"""``publish_board()``: a table artifact of the run's current leases and pending handoffs."""

from __future__ import annotations

import logging
import re
from typing import Any

from prefect_baton._client.sync import Baton
from prefect_baton.prefect._context import BatonLike, current_slot, resolve_baton, run_identity
from prefect_baton.prefect._events import can_emit

__all__ = ["board_rows", "publish_board"]

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


def _artifact_key(text: str) -> str:
    key = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (key or "board")[:100]


def publish_board(
    baton: BatonLike | None = None, *, key: str | None = None, description: str | None = None
) -> Any:
    """Add a table artifact listing the run's current leases and the pending handoffs
    addressed to it (its principal: the deployment or flow name, see ``run_identity``).

    Args:
        baton: client or factory (see :func:`leased`); default: the enclosing lease's
            client, else ``Baton.from_settings()`` acting as the run's principal.
        key: artifact key (lowercase letters, digits, dashes; default
            ``baton-board-<principal>``). description: markdown shown with the table.

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

    return create_table_artifact(
        table=rows,
        key=_artifact_key(key or f"baton-board-{b.principal}"),
        description=description
        or f"Leases held by `{b.principal}` and handoffs waiting for it ({len(rows)} rows).",
    )
