"""The event builder: the kind and payload of each event a lease transition or a handoff
records (DESIGN.md, "Events"). Pure functions; the ledger store and the Redis reconciler
both build their events here and store the payload as canonical JSON, so the two record
the same bytes for the same transition. No I/O.
"""

from __future__ import annotations

from typing import Any

from prefect_baton._rules.validation import validate_id
from prefect_baton.errors import ValidationError

__all__ = [
    "EVENT_KINDS",
    "EXPIRY_LAPSED",
    "EXPIRY_TAKEN_OVER",
    "FENCE_REJECTED",
    "LEASE_EVENT_KINDS",
    "RELEASE_HANDOFF_EXPIRED",
    "RELEASE_HANDOFF_REJECTED",
    "event_lease_id",
    "expired_payload",
    "fence_rejected_payload",
    "handoff_payload",
    "lease_events",
    "lease_payload",
    "released_by_handoff",
    "reports_expiry",
    "validate_event_kind",
    "validate_resource_filter",
]

LEASE_EVENT_KINDS = {
    "acquire": "lease.acquired",
    "takeover": "lease.acquired",
    "supersede": "lease.acquired",
    "renew": "lease.renewed",
    "transfer": "lease.transferred",
    "release": "lease.released",
    "force_release": "lease.released",
}
"""The event kind of each lease decision's action (:attr:`Decision.action
<prefect_baton._rules.core.Decision>`)."""

EVENT_KINDS = (
    "lease.acquired",
    "lease.renewed",
    "lease.transferred",
    "lease.released",
    "lease.expired",
    "checkpoint.saved",
    "checkpoint.deleted",
    "handoff.created",
    "handoff.accepted",
    "handoff.rejected",
    "outcome.recorded",
    "fence.rejected",
)
"""Every kind of event the ledger records (DESIGN.md, "Events"; docs/concepts.md)."""


def validate_event_kind(kind: object) -> str | None:
    """Check the ``kind`` filter of an event listing: ``None`` (every kind) or one of
    :data:`EVENT_KINDS`. The one check of every surface (client, CLI, REST, MCP).

    Raises:
        ValidationError: any other value, naming the known kinds.
    """
    if kind is None or (isinstance(kind, str) and kind in EVENT_KINDS):
        return kind
    raise ValidationError(f"unknown event kind {kind!r}; known kinds: {', '.join(EVENT_KINDS)}")


def validate_resource_filter(resource_type: object, resource_id: object) -> tuple[str, str] | None:
    """Check the resource filter of an event listing: both ``None`` (every resource), or
    both ids of one resource (as ``leases.acquire`` checks them). The one check of every
    surface (client, CLI, REST).

    Returns:
        ``(resource_type, resource_id)``, or ``None`` when neither is given.

    Raises:
        ValidationError: only one of the two given, or a bad id (not a ``str`` of 1..256
            characters without control characters).
    """
    if resource_type is None and resource_id is None:
        return None
    if resource_type is None or resource_id is None:
        raise ValidationError("give resource_type and resource_id together, or neither")
    return validate_id("resource_type", resource_type), validate_id("resource_id", resource_id)


def event_lease_id(payload: dict[str, Any]) -> str | None:
    """The lease an event concerns, as the ledger stores it beside the payload (the column
    the event listing filters a resource's events by): the payload's ``lease_id`` (a
    ``lease.*`` event's generation, the fence of a ``fence.rejected``, the lease a
    ``handoff.*`` carried), or ``None`` (no lease: checkpoint and outcome events, a handoff
    without one)."""
    lease_id = payload.get("lease_id")
    return lease_id if isinstance(lease_id, str) else None


def lease_payload(
    lease_id: str,
    resource_type: str,
    resource_id: str,
    owner: str,
    version: int,
    epoch: int,
    expires_at_ms: int,
) -> dict[str, Any]:
    """The lease part of an event payload: one generation's identity and counters
    (``expires_at_ms``: epoch milliseconds)."""
    return {
        "lease_id": lease_id,
        "resource_type": resource_type,
        "resource_id": resource_id,
        "owner": owner,
        "version": version,
        "epoch": epoch,
        "expires_at_ms": expires_at_ms,
    }


FENCE_REJECTED = "fence.rejected"
"""The kind of the event recorded when the ledger refuses a write fenced by a lease that is
no longer the effective generation (``STALE_FENCE``): the write itself is rolled back, the
refusal is recorded in a transaction of its own (subject ``<resource_type>/<resource_id>``,
payload :func:`fence_rejected_payload`)."""


def fence_rejected_payload(
    lease_id: str, epoch: int, resource_type: str, resource_id: str, write: str
) -> dict[str, Any]:
    """The payload of a ``fence.rejected`` event: the fence presented (``lease_id``,
    ``epoch``), the resource it is a lease of, and the refused ``write`` (the operation,
    e.g. ``checkpoint.save`` or ``outcome.record``)."""
    return {
        "lease_id": lease_id,
        "epoch": epoch,
        "resource_type": resource_type,
        "resource_id": resource_id,
        "write": write,
    }


EXPIRY_LAPSED = "lapsed"
"""``reason`` of a ``lease.expired`` recorded by ``report_expired``: the lease was found past
its TTL with nobody acting on the resource (it is free; a resume may start)."""
EXPIRY_TAKEN_OVER = "taken_over"
"""``reason`` of a ``lease.expired`` recorded when another holder took the resource over
after the lease's TTL ran out (someone already holds it again)."""


def expired_payload(lease: dict[str, Any], reason: str) -> dict[str, Any]:
    """The payload of a ``lease.expired`` event: :func:`lease_payload` of the expired
    generation plus ``reason`` (:data:`EXPIRY_LAPSED` or :data:`EXPIRY_TAKEN_OVER`), so an
    Automation can tell a free resource from one already taken over (DESIGN.md "Events")."""
    return {**lease, "reason": reason}


RELEASE_HANDOFF_REJECTED = "handoff_rejected"
"""``reason`` of a ``lease.released`` recorded when the handoff carrying the lease was
rejected (:func:`prefect_baton._rules.handoffs.decide_carried_release`)."""
RELEASE_HANDOFF_EXPIRED = "handoff_expired"
"""``reason`` of a ``lease.released`` recorded when the handoff carrying the lease expired
unaccepted (:func:`prefect_baton._rules.handoffs.decide_handoff_expiry`)."""


def released_by_handoff(handoff_id: str, reason: str) -> dict[str, Any]:
    """What a ``lease.released`` payload adds when a handoff's end released the lease it
    carried: ``reason`` (:data:`RELEASE_HANDOFF_REJECTED` or :data:`RELEASE_HANDOFF_EXPIRED`)
    and ``handoff_id``. A release by the holder itself has neither."""
    return {"reason": reason, "handoff_id": handoff_id}


def reports_expiry(ended_status: str) -> bool:
    """Whether a generation ended with ``ended_status`` records ``lease.expired`` (unless
    ``report_expired`` recorded it already): a takeover ends a lease whose TTL ran out."""
    return ended_status == "taken_over"


def lease_events(
    action: str,
    new: dict[str, Any] | None,
    *,
    new_status: str,
    forced_by: str | None,
    ended: dict[str, Any] | None,
    ended_status: str | None,
    expiry_reported: bool,
    extra: dict[str, Any] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """The events of one lease transition, in the order they are recorded.

    Args:
        action: the decision's action (a key of :data:`LEASE_EVENT_KINDS`).
        new: :func:`lease_payload` of the new or updated generation (extended in place and
            returned in the list), or ``None`` when there is none.
        new_status: that generation's status (a release's payload carries it).
        forced_by: who forced a release (``ended_by`` of a revoked lease), or ``None``.
        ended: :func:`lease_payload` of the generation the transition ended, or ``None``.
        ended_status: the ended generation's new status, or ``None``.
        expiry_reported: ``lease.expired`` was recorded already for the ended generation
            (only read when :func:`reports_expiry` of ``ended_status``).
        extra: fields the decision adds to its own event's payload (a release by a
            handoff's end: :func:`released_by_handoff`), or ``None``.

    Returns:
        ``(kind, payload)`` pairs: ``lease.expired`` (``reason`` ``taken_over``) for a
        taken-over generation not yet reported, then the transition's own event.

    Raises:
        KeyError: an unknown ``action``.
    """
    events: list[tuple[str, dict[str, Any]]] = []
    if (
        ended is not None
        and ended_status is not None
        and reports_expiry(ended_status)
        and not expiry_reported
    ):
        events.append(("lease.expired", expired_payload(ended, EXPIRY_TAKEN_OVER)))
    if new is None:
        return events
    if action in ("takeover", "supersede"):
        new["previous_lease_id"] = ended["lease_id"] if ended is not None else None
    elif action in ("release", "force_release"):
        new["status"] = new_status
        if forced_by:
            new["forced_by"] = forced_by
    if extra:
        new.update(extra)
    events.append((LEASE_EVENT_KINDS[action], new))
    return events


def handoff_payload(
    handoff_id: str,
    from_principal: str,
    to_principal: str,
    checkpoint_id: str | None,
    lease_id: str | None,
    *,
    accepted_lease_id: str | None = None,
    epoch: int | None = None,
) -> dict[str, Any]:
    """The payload of a ``handoff.*`` event; an accepted handoff that carried a lease adds
    the receiver's new lease id and its epoch (``accepted_lease_id`` and ``epoch``, given
    together)."""
    payload: dict[str, Any] = {
        "handoff_id": handoff_id,
        "from_principal": from_principal,
        "to_principal": to_principal,
        "checkpoint_id": checkpoint_id,
        "lease_id": lease_id,
    }
    if accepted_lease_id is not None:
        payload["accepted_lease_id"] = accepted_lease_id
        payload["epoch"] = epoch
    return payload
