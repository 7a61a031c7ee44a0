"""SQL conditions that mirror rules of the pure core (:mod:`prefect_baton._rules`), so a
query selects exactly the rows the rule would pick: one function per rule, each naming the
rule it mirrors. Change a rule and its condition here together."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, not_, or_
from sqlmodel import col

from prefect_baton._stores.ledger.tables import GenerationRow, HandoffRow

__all__ = ["handoff_expired", "handoff_unexpired", "lease_effective", "lease_lapsed"]


def lease_effective(now_ms: int) -> Any:
    """The condition (a SQLAlchemy expression over :class:`GenerationRow`) that a lease
    generation is effective at ``now_ms`` (epoch milliseconds, the ledger's clock):
    :meth:`Generation.effective <prefect_baton._rules.core.Generation.effective>`, status
    ``active`` and expiry after ``now_ms``."""
    return and_(col(GenerationRow.status) == "active", col(GenerationRow.expires_at_ms) > now_ms)


def lease_lapsed(now_ms: int) -> Any:
    """The condition (over :class:`GenerationRow`) that a lease generation is still active
    on its record but past its TTL at ``now_ms`` (epoch milliseconds):
    :meth:`Generation.lapsed <prefect_baton._rules.core.Generation.lapsed>`, what
    ``report_expired`` reports."""
    return and_(col(GenerationRow.status) == "active", col(GenerationRow.expires_at_ms) <= now_ms)


def handoff_unexpired(now_ms: int) -> Any:
    """The condition (over :class:`HandoffRow`) that a handoff's own expiry has not passed
    at ``now_ms`` (epoch milliseconds): it has none, or it is after ``now_ms``; the first
    test of :func:`~prefect_baton._rules.handoffs.handoff_status`, negated."""
    return or_(col(HandoffRow.expires_at_ms).is_(None), col(HandoffRow.expires_at_ms) > now_ms)


def handoff_expired(now_ms: int) -> Any:
    """The condition that a stored ``pending`` handoff reads ``expired`` at ``now_ms``
    (:func:`~prefect_baton._rules.handoffs.handoff_status`): its own expiry passed, or the
    lease it carries ended (:func:`~prefect_baton._rules.handoffs.carried_lease_ended`:
    the generation it names is not :func:`lease_effective`).

    Over :class:`HandoffRow` outer-joined with the :class:`GenerationRow` of its
    ``lease_id``: a handoff that carries no lease, or an unknown one, has no such row, and
    (as ``carried_lease_ended(None, ...)``) its lease never ended.
    """
    carried_ended = and_(col(GenerationRow.lease_id).is_not(None), not_(lease_effective(now_ms)))
    return or_(not_(handoff_unexpired(now_ms)), carried_ended)
