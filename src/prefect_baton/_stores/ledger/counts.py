"""Count queries over the ledger for the gauges of :mod:`prefect_baton.metrics`: effective
leases per organization and resource type, pending handoffs per organization. Read-only,
one short read transaction each, on the ledger's clock."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, col

from prefect_baton._stores.ledger.conditions import handoff_unexpired, lease_effective
from prefect_baton._stores.ledger.engine import ledger_failure
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.ledger.tables import GenerationRow, HandoffRow

__all__ = ["effective_leases", "pending_handoffs"]


def effective_leases(store: LedgerStore, org: str | None = None) -> list[tuple[str, str, int]]:
    """``(organization, resource_type, count)`` of the leases effective now (active and not
    past their expiry), for ``org`` only when given, largest counts first.

    Raises:
        UnavailableError: the ledger cannot be reached.
    """
    now = store.now_ms()
    n = func.count()
    query = (
        select(col(GenerationRow.org_id), col(GenerationRow.resource_type), n)
        .where(lease_effective(now))
        .group_by(col(GenerationRow.org_id), col(GenerationRow.resource_type))
        .order_by(n.desc())
    )
    if org is not None:
        query = query.where(col(GenerationRow.org_id) == org)
    try:
        with Session(store.engines.read) as session:
            return [(str(o), str(t), int(c)) for o, t, c in session.execute(query)]
    except OperationalError as exc:
        raise ledger_failure(store.engines, exc) from exc


def pending_handoffs(store: LedgerStore, org: str | None = None) -> list[tuple[str, int]]:
    """``(organization, count)`` of the handoffs pending and not past their expiry, for
    ``org`` only when given.

    Raises:
        UnavailableError: the ledger cannot be reached.
    """
    now = store.now_ms()
    query = (
        select(col(HandoffRow.org_id), func.count())
        .where(col(HandoffRow.status) == "pending", handoff_unexpired(now))
        .group_by(col(HandoffRow.org_id))
    )
    if org is not None:
        query = query.where(col(HandoffRow.org_id) == org)
    try:
        with Session(store.engines.read) as session:
            return [(str(o), int(c)) for o, c in session.execute(query)]
    except OperationalError as exc:
        raise ledger_failure(store.engines, exc) from exc
