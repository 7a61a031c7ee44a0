"""The calls into :class:`~prefect_baton.Baton` that the REST routes and the MCP tools
share: each takes the request model of either server (any object with the fields its
protocol names), so how a request's fields map onto the Python API is written once.

What the two servers do differently stays with them: the idempotency key (a header or a
tool argument) and the lease a fence or proof presents are given as arguments.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel

from prefect_baton._client.records import handoff_listing
from prefect_baton._client.sync import Baton
from prefect_baton._rules.paging import events_after
from prefect_baton.models import Checkpoint, Handoff, Lease, Outcome, Receipt
from prefect_baton.rest._responses import (
    CheckpointPage,
    EventPage,
    HandoffPage,
    LeasePage,
    Me,
    OutcomePage,
    ReconcilerLag,
)

if TYPE_CHECKING:
    from prefect_baton._stores.ledger.store import LedgerStore

__all__ = [
    "acquire",
    "acquire_many",
    "checkpoint_history",
    "create_handoff",
    "delete_checkpoint",
    "events_page",
    "force_release",
    "handoffs_page",
    "leases_page",
    "me",
    "outcomes_page",
    "record_outcome",
    "release",
    "renew",
    "resolve_handoff",
    "save_checkpoint",
    "transfer",
]


class AcquireFields(Protocol):
    """The fields of a lease acquisition (REST ``AcquireIn``, MCP ``LeaseAcquireIn``)."""

    resource_type: str
    resource_id: str
    ttl_seconds: int
    purpose: str | None
    scopes: list[str]
    expected_version: int | None


class RenewFields(Protocol):
    """The fields of a lease renewal (REST ``RenewIn``, MCP ``LeaseByIdIn``)."""

    ttl_seconds: int | None
    expected_version: int | None


class TransferFields(Protocol):
    """The fields of a transfer (REST ``TransferIn``, MCP ``LeaseTransferIn``)."""

    to_principal: str
    new_execution_key: str
    ttl_seconds: int
    expected_version: int | None


class BatchItemFields(Protocol):
    """One resource of an all-or-nothing acquire (REST ``BatchItemIn``)."""

    def model_dump(self, *, exclude_none: bool) -> dict[str, Any]:
        """The item's set fields as a dict."""
        ...


class BatchFields(Protocol):
    """The fields of an all-or-nothing acquire (REST ``BatchIn``, MCP
    ``LeaseAcquireManyIn``)."""

    ttl_seconds: int
    purpose: str | None
    scopes: list[str]

    @property
    def resources(self) -> Sequence[BatchItemFields]:
        """The resources, 1..1,000."""
        ...


class CheckpointFields(Protocol):
    """The fields of a checkpoint save (REST ``CheckpointIn``, MCP ``CheckpointSaveIn``)."""

    subject_id: str
    kind: str
    state: dict[str, Any]
    expected_version: int | None
    ttl_seconds: int | None


class HandoffFields(Protocol):
    """The fields of a handoff (REST ``HandoffIn``, MCP ``HandoffCreateIn``)."""

    to_principal: str
    subject_id: str
    checkpoint_id: str | None
    context_id: str | None
    message: str | None
    expires_in_seconds: int | None
    parameters: dict[str, Any] | None


class ResolveFields(Protocol):
    """The fields of a handoff resolution (REST ``ResolveIn``, MCP ``HandoffResolveIn``)."""

    status: Literal["accepted", "rejected"]
    note: str | None
    execution_key: str | None
    ttl_seconds: int | None


class LeaseListFields(Protocol):
    """The filters and page of a lease listing (REST ``LeaseListQuery``, MCP ``LeaseListIn``)."""

    resource_type: str | None
    owner: str | None
    include_ended: bool
    limit: int
    cursor: str | None


class EventListFields(Protocol):
    """The filters and page of an event listing (REST ``EventListQuery``, MCP ``EventListIn``)."""

    after: int | None
    limit: int
    kind: str | None
    cursor: str | None
    resource_type: str | None
    resource_id: str | None
    subject: str | None


class HandoffListFields(Protocol):
    """The filters and page of a handoff listing (REST ``HandoffListQuery``, MCP
    ``HandoffInboxIn``)."""

    party: str | None
    limit: int
    cursor: str | None

    @property
    def status(self) -> str | None:
        """The status to list (read-only, so either server's type fits)."""
        ...


class OutcomeListFields(Protocol):
    """The filter and page of an outcome listing (REST ``OutcomeListQuery``, MCP
    ``OutcomeListIn``)."""

    subject_id: str | None
    limit: int
    cursor: str | None


class CheckpointHistoryFields(Protocol):
    """The checkpoint and page of a checkpoint's history (REST ``CheckpointHistoryQuery``,
    MCP ``CheckpointHistoryIn``)."""

    subject_id: str
    kind: str
    principal: str | None
    limit: int
    cursor: str | None


class OutcomeFields(Protocol):
    """The fields of an outcome (REST ``OutcomeIn``, MCP ``OutcomeRecordIn``)."""

    subject_id: str
    status: Literal["succeeded", "failed", "cancelled"]
    lease_id: str | None
    handoff_id: str | None
    checkpoint_id: str | None

    @property
    def evidence(self) -> Sequence[BaseModel]:
        """The evidence items (read-only, so either server's item model fits)."""
        ...


def acquire(
    b: Baton, a: AcquireFields, idempotency_key: str | None, attempt: str | None = None
) -> Lease:
    """:meth:`Baton.leases.acquire <prefect_baton._client.leases.Leases.acquire>` with the
    fields of ``a``, ``idempotency_key`` and ``attempt`` (``str`` or ``None``).

    Raises:
        BatonError: as that method (CONFLICT, VERSION_CONFLICT, ...).
    """
    return b.leases.acquire(
        a.resource_type,
        a.resource_id,
        ttl_seconds=a.ttl_seconds,
        purpose=a.purpose,
        scopes=a.scopes,
        expected_version=a.expected_version,
        idempotency_key=idempotency_key,
        attempt=attempt,
    )


def renew(b: Baton, lease: Lease, a: RenewFields, idempotency_key: str | None) -> Lease:
    """``b.leases.renew`` of ``lease`` (the caller's proof, a
    :class:`~prefect_baton.models.Lease`) with the fields of ``a``.

    Raises:
        BatonError: as that method (LEASE_LOST, VERSION_CONFLICT, ...).
    """
    return b.leases.renew(
        lease,
        ttl_seconds=a.ttl_seconds,
        expected_version=a.expected_version,
        idempotency_key=idempotency_key,
    )


def save_checkpoint(
    b: Baton, a: CheckpointFields, fence: Lease | None, idempotency_key: str | None
) -> Checkpoint:
    """``b.checkpoints.save`` with the fields of ``a``, fenced by ``fence`` (a
    :class:`~prefect_baton.models.Lease` or ``None``).

    Raises:
        BatonError: as that method (STALE_FENCE, VERSION_CONFLICT, ...).
    """
    return b.checkpoints.save(
        a.subject_id,
        a.kind,
        a.state,
        expected_version=a.expected_version,
        fence=fence,
        idempotency_key=idempotency_key,
        ttl_seconds=a.ttl_seconds,
    )


def create_handoff(
    b: Baton, a: HandoffFields, lease: Lease | None, idempotency_key: str | None
) -> Handoff:
    """``b.handoffs.create`` with the fields of ``a``, carrying ``lease`` (a
    :class:`~prefect_baton.models.Lease` the caller holds, or ``None``).

    Raises:
        BatonError: as that method (NOT_FOUND, LEASE_LOST, VALIDATION_ERROR, ...).
    """
    return b.handoffs.create(
        a.to_principal,
        a.subject_id,
        checkpoint_id=a.checkpoint_id,
        context_id=a.context_id,
        message=a.message,
        lease=lease,
        idempotency_key=idempotency_key,
        expires_in_seconds=a.expires_in_seconds,
        parameters=a.parameters,
    )


def resolve_handoff(
    b: Baton, handoff_id: str, a: ResolveFields, idempotency_key: str | None
) -> Handoff:
    """``b.handoffs.resolve`` of ``handoff_id`` (``str``) with the fields of ``a``.

    Raises:
        BatonError: as that method (NOT_FOUND, FORBIDDEN, LEASE_LOST, ...).
    """
    return b.handoffs.resolve(
        handoff_id,
        a.status,
        a.note,
        execution_key=a.execution_key,
        ttl_seconds=a.ttl_seconds,
        idempotency_key=idempotency_key,
    )


def record_outcome(
    b: Baton, a: OutcomeFields, fence: Lease | None, idempotency_key: str | None
) -> Outcome:
    """``b.outcomes.record`` with the fields of ``a`` (its evidence items as dicts),
    fenced by ``fence`` (a :class:`~prefect_baton.models.Lease` or ``None``).

    Raises:
        BatonError: as that method (STALE_FENCE, NOT_FOUND, ...).
    """
    return b.outcomes.record(
        a.subject_id,
        a.status,
        evidence=[e.model_dump() for e in a.evidence],
        fence=fence,
        lease_id=a.lease_id,
        handoff_id=a.handoff_id,
        checkpoint_id=a.checkpoint_id,
        idempotency_key=idempotency_key,
    )


def transfer(b: Baton, lease: Lease, a: TransferFields, idempotency_key: str | None) -> Lease:
    """``b.leases.transfer`` of ``lease`` (the caller's proof) with the fields of ``a``;
    returns the receiver's lease.

    Raises:
        BatonError: as that method (LEASE_LOST, VERSION_CONFLICT, VALIDATION_ERROR, ...).
    """
    return b.leases.transfer(
        lease,
        to_principal=a.to_principal,
        new_execution_key=a.new_execution_key,
        ttl_seconds=a.ttl_seconds,
        expected_version=a.expected_version,
        idempotency_key=idempotency_key,
    )


def release(
    b: Baton, lease: Lease, expected_version: int | None, idempotency_key: str | None
) -> Receipt:
    """``b.leases.release`` of ``lease`` (the caller's proof) at ``expected_version``
    (``int`` or ``None``).

    Raises:
        BatonError: as that method (LEASE_LOST, VERSION_CONFLICT, NOT_FOUND, ...).
    """
    return b.leases.release(
        lease, expected_version=expected_version, idempotency_key=idempotency_key
    )


def force_release(b: Baton, lease_id: str, idempotency_key: str | None) -> Receipt:
    """``b.leases.force_release`` of ``lease_id`` (``str``): the receipt says
    ``forced: true`` (the seed service's field).

    Raises:
        BatonError: FORBIDDEN for an ``agent``, NOT_FOUND, as that method.
    """
    return b.leases.force_release(lease_id, idempotency_key=idempotency_key)


def acquire_many(
    b: Baton, a: BatchFields, idempotency_key: str | None, attempt: str | None = None
) -> list[Lease]:
    """``b.leases.acquire_many`` of ``a.resources`` (unset item fields take ``a``'s
    TTL, purpose and scopes) as attempt ``attempt`` (``str`` or ``None``): every lease or
    none, in request order.

    Raises:
        BatonError: the first refused item's error (nothing acquired), as that method.
    """
    return b.leases.acquire_many(
        [item.model_dump(exclude_none=True) for item in a.resources],
        ttl_seconds=a.ttl_seconds,
        purpose=a.purpose,
        scopes=a.scopes,
        idempotency_key=idempotency_key,
        attempt=attempt,
    )


def leases_page(b: Baton, q: LeaseListFields) -> LeasePage:
    """One page of ``b.leases.list`` with the filters of ``q`` (newest first, ``q.limit``
    1..10,000) after ``q.cursor`` (``str`` from a previous page's ``next_cursor``, or
    ``None``).

    Raises:
        BatonError: VALIDATION_ERROR (a bad limit or cursor), FORBIDDEN (another
            principal's leases asked by an ``agent``).
    """
    leases = b.leases.list(
        resource_type=q.resource_type,
        owner=q.owner,
        include_ended=q.include_ended,
        limit=q.limit,
        cursor=q.cursor,
    )
    return LeasePage(leases=leases, next_cursor=leases.next_cursor)


def handoffs_page(b: Baton, q: HandoffListFields) -> HandoffPage:
    """One page (oldest first, ``q.limit`` 1..10,000, after ``q.cursor`` as in
    :func:`leases_page`) of ``b.handoffs.inbox`` without ``q.party``, else of
    ``b.handoffs.list`` (``q.party``: a principal or ``"*"``; ``q.status`` default
    ``pending``), as :func:`prefect_baton._client.records.handoff_listing` decides.

    Raises:
        BatonError: VALIDATION_ERROR (a bad party, status, limit or cursor, or ``status``
            without ``party``), FORBIDDEN (another principal's or everyone's handoffs
            asked by an ``agent``).
    """
    handoffs = handoff_listing(b.handoffs, q.party, q.status, limit=q.limit, cursor=q.cursor)
    return HandoffPage(handoffs=handoffs, next_cursor=handoffs.next_cursor)


def events_page(b: Baton, q: EventListFields) -> EventPage:
    """One page of ``b.events.list``: events with ``seq > q.after`` (``int``; ``None``: not
    given), or after ``q.cursor`` (as :func:`leases_page`), or from the start when neither
    is given, in commit order, ``q.limit`` 1..1,000; of ``q.kind``, of resource
    ``(q.resource_type, q.resource_id)`` and of ``q.subject`` when given (``str``, as
    ``b.events.list``).

    Raises:
        BatonError: VALIDATION_ERROR (a bad ``after`` (named so), limit, cursor, kind or
            id, only one of ``resource_type``/``resource_id``, or both ``after`` and
            ``cursor``, ``after=0`` too).
    """
    events = b.events.list(
        events_after(q.after, q.cursor, name="after"),
        q.limit,
        q.kind,
        resource_type=q.resource_type,
        resource_id=q.resource_id,
        subject=q.subject,
    )
    return EventPage(events=events, next_cursor=events.next_cursor)


def checkpoint_history(b: Baton, q: CheckpointHistoryFields) -> CheckpointPage:
    """One page of ``b.checkpoints.history``: the versions of the checkpoint of
    ``(q.subject_id, q.principal or the caller, q.kind)`` (``str`` ids), oldest first, at
    most ``q.limit`` (``int``, 1..1,000), after ``q.cursor`` as in :func:`leases_page`.

    Raises:
        BatonError: as that method (VALIDATION_ERROR: bad ids, limit or cursor).
    """
    versions = b.checkpoints.history(
        q.subject_id, q.kind, q.principal, limit=q.limit, cursor=q.cursor
    )
    return CheckpointPage(checkpoints=versions, next_cursor=versions.next_cursor)


def outcomes_page(b: Baton, q: OutcomeListFields) -> OutcomePage:
    """One page of ``b.outcomes.list``: outcomes of the org (of ``q.subject_id`` when
    given), oldest first, at most ``q.limit`` (``int``, 1..100,000), after ``q.cursor`` as
    in :func:`leases_page`.

    Raises:
        BatonError: VALIDATION_ERROR (a bad subject id, limit or cursor).
    """
    outcomes = b.outcomes.list(q.subject_id, limit=q.limit, cursor=q.cursor)
    return OutcomePage(outcomes=outcomes, next_cursor=outcomes.next_cursor)


def me(b: Baton, scopes: Collection[str] | None, key_id: str | None) -> Me:
    """Who ``b`` acts as: its org, principal and role, the ``scopes`` granted (``None``:
    all), the bearer key's ``key_id`` (``None`` without one) and the checkpoint state
    limit in bytes."""
    return Me(
        org=b.org,
        principal=b.principal,
        role=b.role,
        scopes=None if scopes is None else sorted(scopes),
        key_id=key_id,
        state_max_bytes=b.checkpoints.state_max_bytes,
    )


def reconciler_lag(b: Baton, authority: object, ledger: LedgerStore) -> ReconcilerLag:
    """How far ``ledger`` (the app's ledger) is behind ``authority`` (the app's lease
    authority) for ``b``'s org: 0 entries when the ledger is the authority, else the Redis
    reconciler's :meth:`~prefect_baton._stores.redis.reconciler.Reconciler.lag`.

    Raises:
        UnavailableError: Redis cannot be reached.
        ForbiddenError: the server has no Redis URL and Redis decides the org's leases
            (:meth:`LedgerStore.check_ledger_decides`): the ledger's copy lags an authority
            this server does not see, so its lag is unknown here.
    """
    reconciler = getattr(authority, "reconciler", None)
    if reconciler is None:
        ledger.check_ledger_decides(b.org)
        return ReconcilerLag(authority="ledger", entries=0, seconds=0.0)
    lag = reconciler.lag(b.org)
    return ReconcilerLag(authority="redis", entries=lag.entries, seconds=round(lag.seconds, 3))


def delete_checkpoint(b: Baton, checkpoint_id: str, idempotency_key: str | None) -> Checkpoint:
    """``b.checkpoints.delete`` of ``checkpoint_id`` (``str``): the checkpoint as deleted.

    Raises:
        BatonError: NOT_FOUND, FORBIDDEN (not yours), CONFLICT (a pending handoff carries
            it), as that method.
    """
    return b.checkpoints.delete(checkpoint_id, idempotency_key=idempotency_key)
