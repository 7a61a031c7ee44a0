"""The handoff rules of the pure core: what status a handoff reads as, and what happens to
the lease it carries when it is rejected or expires (DESIGN.md "Handoffs").

No I/O and no clock: every function takes ``now_ms`` (epoch milliseconds read from the
authority) and the rows it needs. The ledger store applies these decisions in its
transactions; the Redis authority applies them around its scripts (the lease lives in
Redis, the handoff in the ledger), reading the carried generation and the clock from Redis.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from prefect_baton._rules.access import may_read
from prefect_baton._rules.core import (
    Decision,
    Generation,
    Proof,
    ReleaseRequest,
    handoff_deadline_passed,
)
from prefect_baton._rules.events import RELEASE_HANDOFF_EXPIRED, released_by_handoff
from prefect_baton._rules.transitions import decide_release
from prefect_baton.errors import ValidationError

__all__ = [
    "HANDOFF_STATUSES",
    "STATUS_NEEDS_PARTY",
    "HandoffExpiry",
    "accepted_lease_view",
    "carried_lease_ended",
    "deadline_came_first",
    "decide_carried_release",
    "decide_handoff_expiry",
    "expired_message",
    "handoff_status",
    "listing_status",
    "not_pending_message",
    "releases_carried",
    "resolution_recorded",
    "stored_statuses",
    "validate_status_filter",
]

HANDOFF_STATUSES = ("pending", "accepted", "rejected", "expired")
"""The statuses a handoff reads as (:func:`handoff_status`)."""


def accepted_lease_view(
    accepted: Generation | None, *, role: str, principal: str
) -> Generation | None:
    """The ``lease`` of a handoff as ``principal`` (with ``role``) reads it, in ``get`` and
    ``list`` alike: the generation the handoff's acceptance gave its recipient (``accepted``:
    the row of its ``accepted_lease_id`` as it stands now, renewed or ended since; ``None``
    for a handoff not accepted or that carried no lease), to whoever may read that lease as
    ``leases.get`` lets them (:func:`~prefect_baton._rules.access.may_read`: its holder, the
    recipient, and ``owner``/``admin``); ``None`` for anyone else (the sender, an agent, no
    longer holds it)."""
    if accepted is None or not may_read(role, principal, (accepted.owner,)):
        return None
    return accepted


def validate_status_filter(status: object) -> str | None:
    """The status filter of a handoff listing: one of :data:`HANDOFF_STATUSES`, or ``"any"``
    (every status, returned as ``None``).

    Raises:
        ValidationError: anything else.
    """
    if status == "any":
        return None
    if not isinstance(status, str) or status not in HANDOFF_STATUSES:
        raise ValidationError(
            f"status must be one of pending, accepted, rejected, expired or any, got {status!r}"
        )
    return status


STATUS_NEEDS_PARTY = (
    "status filters the handoffs of a party: give party as well (a principal, or '*' for "
    "everyone's)"
)
"""The ``VALIDATION_ERROR`` message of a handoff listing given a status but no party
(:func:`listing_status`), the same on every surface."""


def listing_status(party: str | None, status: str | None) -> str | None:
    """Which handoff listing a request for ``party`` and ``status`` (``None``: not given)
    asks for, on every surface (``baton handoff inbox``, ``GET /v1/handoffs``,
    ``baton_handoff_inbox``).

    Returns:
        ``None`` without ``party``: the caller's inbox (pending handoffs addressed to it).
        Otherwise the status (``str``) to list ``party``'s handoffs by: ``status``, or
        ``"pending"`` when not given (checked later by :func:`validate_status_filter`).

    Raises:
        ValidationError: ``status`` without ``party`` (:data:`STATUS_NEEDS_PARTY`): the
            inbox has no status filter.
    """
    if party is None:
        if status is not None:
            raise ValidationError(STATUS_NEEDS_PARTY)
        return None
    return "pending" if status is None else status


def stored_statuses(status: str) -> tuple[str, ...]:
    """The stored statuses of the handoffs that may read as ``status``
    (:func:`handoff_status`): a stored ``pending`` one reads ``expired`` once past its
    expiry or once its carried lease ended, so ``expired`` is looked for among both."""
    return ("pending", "expired") if status == "expired" else (status,)


def carried_lease_ended(carried: Generation | None, now_ms: int) -> bool:
    """Whether the lease a pending handoff carries is no longer in effect, so the handoff
    can never be accepted.

    ``carried`` is the generation the handoff names (``None``: the handoff carries no
    lease, or it is unknown). It ended unless it is still ``active`` before its expiry on
    the authority's clock: it ran out, or its sender released it, or it was transferred
    (another handoff carrying it was accepted), superseded by a re-acquire, force-released
    (``revoked``) or taken over. Such a handoff reads ``expired`` (:func:`handoff_status`).
    """
    return carried is not None and not carried.effective(now_ms)


#: How a carried lease that is no longer in effect ended, as :func:`expired_message` says it.
_ENDED_HOW = {
    "active": "ran out",
    "expired": "ran out",
    "released": "was released",
    "transferred": "moved to another holder (another handoff carrying it was accepted, or "
    "it was transferred)",
    "superseded": "was re-acquired under a new generation",
    "revoked": "was force-released",
    "taken_over": "was taken over",
}


def expired_message(
    handoff_id: str, expires_at_ms: int | None, carried: Generation | None, now_ms: int
) -> str:
    """The ``NOT_FOUND`` message for resolving handoff ``handoff_id`` once it reads (or is
    stored) ``expired`` (:func:`handoff_status`): its own expiry (``expires_at_ms``) passed,
    or the lease it carries (``carried``, ``None`` when it carries none) is no longer in
    effect, which the message says, with how that lease ended (``... has expired: the lease
    it carries (L) moved to another holder ...``)."""
    if (expires_at_ms is not None and expires_at_ms <= now_ms) or not carried_lease_ended(
        carried, now_ms
    ):
        return f"handoff {handoff_id} has expired"
    assert carried is not None  # carried_lease_ended said so
    how = _ENDED_HOW.get(carried.status, f"ended ({carried.status})")
    return (
        f"handoff {handoff_id} has expired: the lease it carries ({carried.lease_id}) {how}, "
        "so it can no longer be accepted"
    )


def not_pending_message(
    handoff_id: str,
    status: str,
    expires_at_ms: int | None,
    carried: Generation | None,
    now_ms: int,
) -> str:
    """The ``NOT_FOUND`` message, for its sender or recipient, for resolving handoff
    ``handoff_id`` stored with ``status`` other than ``pending``: ``already accepted`` /
    ``already rejected``, or why it expired (:func:`expired_message`). Anyone else is told
    only ``pending handoff ... not found``."""
    if status == "expired":
        return expired_message(handoff_id, expires_at_ms, carried, now_ms)
    return f"handoff {handoff_id} was already {status}; only a pending handoff can be resolved"


def resolution_recorded(
    handoff_id: str,
    *,
    status: str,
    note: str | None,
    carried_lease: bool,
    held_key: str | None,
    asked_status: str,
    asked_note: str | None,
    asked_key: str | None,
) -> bool:
    """Whether a resolve of handoff ``handoff_id`` that asks for ``asked_status`` (with
    ``asked_note``, and for an accept the recipient's execution key ``asked_key``, ``None``
    for ``handoff:<handoff_id>``) finds its own effect already recorded, so that a keyed
    retry of it whose receipt was never stored (the process died, or storing it failed,
    after the resolution committed) replays the handoff instead of answering ``NOT_FOUND``
    as a second resolve (DESIGN.md "Idempotency and receipts": an exact retry replays).

    The handoff reads ``status`` with ``note``; ``carried_lease``: it carried a lease;
    ``held_key``: the execution key of the lease generation its acceptance gave the caller,
    as the caller reads the handoff (``None`` when there is none). Recorded means: the same status
    and note, and for an accepted handoff that carried a lease, that lease under the
    asked key. Anything else (resolved otherwise, expired, or the accepted lease moved on)
    is not this request's effect: the retry resolves again and gets that answer.
    """
    if status != asked_status or note != asked_note:
        return False
    if status == "accepted" and carried_lease:
        return held_key is not None and held_key == (asked_key or f"handoff:{handoff_id}")
    return True


def handoff_status(
    status: str, expires_at_ms: int | None, now_ms: int, *, carried_ended: bool
) -> str:
    """The status a handoff reads as (DESIGN.md "Handoffs").

    A ``pending`` handoff reads ``expired`` once its own expiry (``expires_at_ms``) has
    passed, or once the lease it carries is no longer in effect (``carried_ended``, see
    :func:`carried_lease_ended`: it ran out, was released, transferred, superseded,
    force-released or taken over): nothing can be transferred any more, so it leaves the
    recipient's inbox and can no longer be resolved (``NOT_FOUND``). Other statuses are kept
    (a stored ``expired`` too: :func:`decide_handoff_expiry` marks it).
    """
    if status != "pending":
        return status
    if handoff_deadline_passed(expires_at_ms, now_ms):
        return "expired"
    return "expired" if carried_ended else "pending"


def releases_carried(
    carried: Generation | None,
    from_principal: str,
    now_ms: int,
    *,
    deadline_ms: int | None = None,
) -> bool:
    """Whether ending a pending handoff without acceptance (a rejection, or its own
    expiry) releases the lease it carries.

    Handing a lease over gives it away: from :func:`handoff_to` on the sender no longer
    releases it (an acceptance fences the sender out at any moment), and a Prefect sender's
    block has usually ended. A handoff that ends unaccepted therefore releases the carried
    generation in the same step when it is still the sender's and effective, recorded as
    ``lease.released``, instead of leaving the resource held by nobody until the TTL. A
    lease that already ended or moved is left as it is.

    ``deadline_ms`` (epoch ms; given when the handoff's expiry ends it) is the handoff's own
    deadline: a carried lease of the sender's still ``active`` on its record whose TTL ran
    out at or after that deadline (:func:`deadline_came_first`) is released too, even when
    nobody ended the handoff before the TTL: the deadline ended the lease first, so it is
    released for the handoff (reason ``handoff_expired``) and never reported ``lapsed``.
    """
    if carried is None or carried.owner != from_principal:
        return False
    return carried.effective(now_ms) or deadline_came_first(carried, deadline_ms)


def deadline_came_first(carried: Generation, deadline_ms: int | None) -> bool:
    """Whether the deadline ``deadline_ms`` (epoch ms, ``None``: none) of a pending
    handoff carrying ``carried`` came at or before that lease's own expiry while the lease
    is still ``active`` on its record: the handoff's expiry, not the TTL, ended it."""
    return (
        deadline_ms is not None
        and carried.status == "active"
        and deadline_ms <= carried.expires_at_ms
    )


def decide_carried_release(
    carried: Generation | None,
    *,
    handoff_id: str,
    from_principal: str,
    reason: str,
    now_ms: int,
    deadline_ms: int | None = None,
) -> Decision | None:
    """The release of the lease a handoff carries when it ends unaccepted, or ``None`` when
    :func:`releases_carried` says to leave it.

    Args:
        carried: the carried generation as the lease authority has it (``None``: unknown).
        handoff_id: the handoff (named in the ``lease.released`` payload).
        from_principal: its sender, whose proof releases the lease.
        reason: :data:`~prefect_baton._rules.events.RELEASE_HANDOFF_REJECTED` or
            :data:`~prefect_baton._rules.events.RELEASE_HANDOFF_EXPIRED`.
        now_ms: the authority's clock (epoch milliseconds).
        deadline_ms: the handoff's own deadline (epoch ms) when its expiry ends it, else
            ``None``; a lease whose TTL ran out at or after it is released too, and ends
            ``released`` (:func:`releases_carried`).

    Returns:
        A ``release`` :class:`Decision` (version and epoch kept) whose ``extra`` carries the
        ``reason`` and ``handoff_id`` of its ``lease.released`` event, or ``None``.
    """
    if not releases_carried(carried, from_principal, now_ms, deadline_ms=deadline_ms):
        return None
    assert carried is not None
    proof = Proof(carried.lease_id, from_principal, carried.execution_key)
    release = decide_release(carried, ReleaseRequest(proof), now_ms=now_ms)
    if release.new is not None and release.new.status == "expired":
        # past its TTL, but the handoff's deadline ended it first: released, not expired
        release = replace(
            release, new=replace(release.new, status="released"), receipt_status="released"
        )
    return replace(release, extra=released_by_handoff(handoff_id, reason))


@dataclass(frozen=True, slots=True)
class HandoffExpiry:
    """What an expired pending handoff turns into (:func:`decide_handoff_expiry`).

    Attributes:
        handoff_id: the handoff, to be stored as ``expired`` (resolved at ``now_ms``).
        release: the release of the lease it carries (see :func:`decide_carried_release`),
            or ``None`` when there is none to release.
    """

    handoff_id: str
    release: Decision | None


def decide_handoff_expiry(
    handoff_id: str,
    status: str,
    expires_at_ms: int | None,
    *,
    carried: Generation | None,
    from_principal: str,
    now_ms: int,
) -> HandoffExpiry | None:
    """Decide whether a handoff has expired and what becomes of the lease it carries.

    A ``pending`` handoff that reads ``expired`` (:func:`handoff_status`: its own
    ``expires_at_ms`` passed, or its carried lease ended) is marked ``expired``; when its
    carried lease is still the sender's and effective it is released in the same step,
    recorded as ``lease.released`` with ``reason`` ``handoff_expired``, so the resource is
    free at the handoff's deadline instead of at the lease's TTL. When nobody came between
    the deadline and the lease's TTL (no read, acquire or sweep), a carried lease still
    ``active`` on its record whose TTL ran out at or after the deadline is released all the
    same (:func:`deadline_came_first`), ending ``released`` with ``reason``
    ``handoff_expired``: the handoff's deadline ended it, so it is never reported as a
    ``lapsed`` expiry (which a resume Automation would act on). The decision is the same
    whoever applies it (a read, a resolve, an acquire of the resource, the sweep) and
    applying it twice finds nothing left to do: the handoff is no longer pending.

    Safety: an acceptance settles the handoff (``accepted``) and moves the lease to a new
    generation before the deadline, or is refused after it (``NOT_FOUND``), on the same
    authority clock, so a lease accepted before the deadline is never released here.

    Args:
        handoff_id: the handoff. status: its stored status.
        expires_at_ms: its own expiry (epoch ms), or ``None``.
        carried: the generation it carries as the lease authority has it, or ``None``.
        from_principal: its sender. now_ms: the authority's clock (epoch ms).

    Returns:
        A :class:`HandoffExpiry`, or ``None`` when the handoff is not an expired pending one.
    """
    ended = carried_lease_ended(carried, now_ms)
    if (
        status != "pending"
        or handoff_status(status, expires_at_ms, now_ms, carried_ended=ended) != "expired"
    ):
        return None
    release = decide_carried_release(
        carried,
        handoff_id=handoff_id,
        from_principal=from_principal,
        reason=RELEASE_HANDOFF_EXPIRED,
        now_ms=now_ms,
        deadline_ms=expires_at_ms,
    )
    return HandoffExpiry(handoff_id, release)
