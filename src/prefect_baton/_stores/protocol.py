"""The types and protocols every store implements, so the client never asks which store it has.

Two protocols, both implemented by every store the client runs on:

* :class:`LeaseAuthority`: the lease operations (the SQL ledger
  :class:`~prefect_baton._stores.ledger.store.LedgerStore`, the Redis fast path
  :class:`~prefect_baton._stores.redis.authority.RedisAuthority`, the REST API client
  :class:`~prefect_baton._stores.rest.client.RestStore`), including ``acquire_many``,
  idempotency receipts of the operations by proof or id, the fence of a fenced record write
  and the barrier before record operations;
* :class:`RecordStore`: checkpoints, handoffs, outcomes and events (the ledger, or the REST
  API).

One conformance suite holds every store to the same results. Arguments arrive validated by
the client (:mod:`prefect_baton._rules`); times are milliseconds; every method raises the
:mod:`prefect_baton.errors` of the matching rule in :mod:`prefect_baton._rules.core` or
:mod:`prefect_baton._rules.transitions`, and :class:`~prefect_baton.errors.UnavailableError`
when its backing service cannot be reached. The queries of the list operations
(:class:`~prefect_baton._stores.queries.LeaseQuery`,
:class:`~prefect_baton._stores.queries.HandoffQuery`) are in :mod:`prefect_baton._stores.queries`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prefect_baton._rules.core import (
    AcquireRequest,
    Generation,
    Proof,
    ReleaseRequest,
    RenewRequest,
    TransferRequest,
)
from prefect_baton._stores.queries import (
    EventQuery,
    HandoffQuery,
    HistoryQuery,
    LeaseQuery,
    OutcomeQuery,
)
from prefect_baton.models import (
    Checkpoint,
    Event,
    Evidence,
    Handoff,
    Lease,
    LeaseInfo,
    Outcome,
    Receipt,
)

__all__ = [
    "MAX_MANY",
    "AcquireRequest",
    "Caller",
    "CheckpointWrite",
    "Execution",
    "Fence",
    "HandoffOffer",
    "Idempotency",
    "LeaseAuthority",
    "OutcomeWrite",
    "RecordStore",
    "ReleaseRequest",
    "RenewRequest",
    "ResolveRequest",
    "TransferRequest",
]

MAX_MANY = 1000
"""The most resources one ``acquire_many`` call takes."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is acting: ``org`` and ``principal`` (ids) and ``role`` (agent/owner/admin)."""

    org: str
    principal: str
    role: str = "agent"


@dataclass(frozen=True, slots=True)
class Execution:
    """Which execution, and which attempt of it, an acquire is made for (validated by the
    client).

    Attributes:
        key: the execution key (``str``, 1..256 characters; the ``Idempotency-Key``), or
            ``None`` (no receipt is kept).
        attempt: the token of this attempt of the execution (``str``, 1..256 characters),
            or ``None`` (an anonymous attempt). Whether a stored receipt replays to it is
            :func:`prefect_baton._rules.core.replay_check`'s decision.
    """

    key: str | None = None
    attempt: str | None = None


@dataclass(frozen=True, slots=True)
class ResolveRequest:
    """How :meth:`LeaseAuthority.handoff_resolve` resolves a pending handoff (validated by
    the client).

    Attributes:
        handoff_id: the handoff (``str`` id); unknown, resolved or expired is
            ``NotFoundError``, not addressed to the caller ``ValidationError``.
        status: ``"accepted"`` or ``"rejected"``.
        note: kept with the resolution (``str``), or ``None``.
        execution_key: the recipient's execution key of a carried lease (``str``), or
            ``None`` for ``handoff:<handoff_id>``.
        ttl_ms: the carried lease's new TTL (``int``, milliseconds), or ``None`` for the
            sender's TTL.
    """

    handoff_id: str
    status: str
    note: str | None = None
    execution_key: str | None = None
    ttl_ms: int | None = None


@dataclass(frozen=True, slots=True)
class CheckpointWrite:
    """One write of :meth:`RecordStore.checkpoint_save` (validated by the client).

    Attributes:
        subject_id, kind: which checkpoint of the caller (``str`` ids).
        state: the state, a JSON object; ``state_text`` is its canonical JSON (at most
            :attr:`RecordStore.state_max_bytes` bytes) and ``state_hash`` its digest, as
            :func:`prefect_baton._rules.core.validate_state` returns them.
        expected_version: compare-and-swap (``0``: must not exist yet;
            ``VersionConflictError`` when it differs), or ``None`` (last write wins).
        fence: the lease the write is fenced by (``StaleFenceError`` once it is no longer
            the effective lease of its resource), or ``None``.
        ttl_ms: after this many milliseconds (``int``) the checkpoint reads as absent, or
            ``None`` (kept).
    """

    subject_id: str
    kind: str
    state: dict[str, Any]
    state_text: str
    state_hash: str
    expected_version: int | None = None
    fence: Fence | None = None
    ttl_ms: int | None = None


@dataclass(frozen=True, slots=True)
class HandoffOffer:
    """What :meth:`RecordStore.handoff_create` offers (validated by the client).

    Attributes:
        to_principal: the recipient (``str`` id); the caller itself is ``ValidationError``.
        subject_id: what the work is about (``str`` id).
        checkpoint_id: a checkpoint of the org to resume from (``NotFoundError`` when
            unknown), or ``None``.
        context_id, message: free context id and text (``str``), or ``None``.
        lease: the proof of a lease the caller holds, handed over on accept
            (``LeaseLostError`` when it is no longer held), or ``None``.
        expires_in_ms: the offer lapses after this many milliseconds (``int``), or
            ``None`` (never).
        parameters: parameters for the recipient's run (a JSON object, validated by
            :func:`prefect_baton._rules.validation.validate_state`), or ``None``.
        lease_fence: the lease authority's :class:`Fence` of that lease
            (:meth:`LeaseAuthority.fence`): with a ``check``, whether the lease is held is
            read from the authority (Redis) instead of the ledger's copy; without one the
            ledger judges it, only where the ledger decides the org's leases.
    """

    to_principal: str
    subject_id: str
    checkpoint_id: str | None = None
    context_id: str | None = None
    message: str | None = None
    lease: Proof | None = None
    expires_in_ms: int | None = None
    parameters: dict[str, Any] | None = None
    lease_fence: Fence | None = None


@dataclass(frozen=True, slots=True)
class OutcomeWrite:
    """One outcome for :meth:`RecordStore.outcome_record` (validated by the client).

    Attributes:
        subject_id: what the outcome is of (``str`` id).
        status: the outcome status (``succeeded`` needs evidence; see
            :meth:`prefect_baton.Baton.outcomes`).
        evidence: the evidence items (at most 1,000).
        fence: the lease the record is fenced by (``StaleFenceError`` once it is no longer
            the effective lease of its resource), or ``None``.
        lease_id, handoff_id, checkpoint_id: linked ids of the org (``NotFoundError``
            when unknown), or ``None``; without ``lease_id`` the fence's lease is linked.
        ledger_authority: the record store is the caller's lease authority too (no Redis
            URL), so a linked lease is judged on the ledger's rows only where the ledger
            decides the org's leases (``ForbiddenError`` where Redis does: the ledger's
            copy lags it); ``False`` when another authority (Redis) drained its journal
            into the ledger first (``ledger_barrier``).
    """

    subject_id: str
    status: str
    evidence: Sequence[Evidence] = ()
    fence: Fence | None = None
    lease_id: str | None = None
    handoff_id: str | None = None
    checkpoint_id: str | None = None
    ledger_authority: bool = True


@dataclass(frozen=True)
class Fence:
    """A lease presented as a fencing token: its id and epoch.

    When another authority than the ledger holds the leases (Redis), ``resource`` names the
    lease's resource (its lock serialises fenced writes of that resource) and ``check``
    reads the generation and the authority's clock inside the write transaction, so the
    fence is judged by the authority, not by the ledger's copy; ``end_carriers`` then ends
    the expired pending handoffs carrying the lease on that authority, as its refused renew
    does (run once a write refused past such a handoff's deadline has rolled back). Made by
    :meth:`LeaseAuthority.fence`.
    """

    lease_id: str
    epoch: int
    resource: tuple[str, str] | None = None
    check: Callable[[], tuple[Generation | None, int]] | None = None
    end_carriers: Callable[[], object] | None = None


@dataclass(frozen=True, slots=True)
class Idempotency:
    """The idempotency key of an operation whose authority keeps no receipt inside the
    operation itself (renew, transfer, release, release by id, force release, handoff
    resolve), and the request it names.

    Attributes:
        key: the validated key (``str``, 1..256 characters).
        scope: the rest of the receipt's identity besides (org, principal, operation, key):
            the resource key of a lease presented by proof, ``handoff:<id>`` of a resolve,
            ``""`` for release/force release by id (the lease id is then in ``fields``).
        fields: the request as the caller gave it (its canonical JSON is digested, so the
            same key with another request is ``IDEMPOTENCY_MISMATCH``).

    A store that keeps the receipt itself runs the operation at most once per key
    (:func:`prefect_baton._stores.ledger.receipts.run_once`); the REST client sends ``key``
    as the ``Idempotency-Key`` header and the server keeps the receipt.
    """

    key: str
    scope: str
    fields: Mapping[str, object]


class LeaseAuthority(Protocol):
    """Applies lease decisions atomically (one transaction, script or request each).

    Every method takes the acting :class:`Caller` first (a REST store acts as its key's
    identity whatever it is given). Times are milliseconds. Errors: the method's own
    ``Raises``, plus :class:`~prefect_baton.errors.UnavailableError` when the store cannot be
    reached (the operation may or may not have been applied: retry with the same key).
    """

    def bound_caller(self) -> Caller | None:
        """The identity every operation of this store acts as when the store decides it
        (a REST API key's, asked once), else ``None`` (the caller passed is the actor).

        A store that decides the identity is also the :class:`RecordStore` of its
        operations. Raises: UnauthenticatedError (a refused key), UnavailableError,
        ValidationError (the URL serves no such API).
        """
        ...

    def acquire(self, caller: Caller, request: AcquireRequest, execution: Execution) -> Lease:
        """Acquire, or take over after expiry, the lease ``request`` names (its resource, TTL
        in milliseconds, scopes, purpose and expected version; rules:
        :func:`prefect_baton._rules.core.decide_acquire`).

        ``execution.key`` is the execution key: an exact retry returns the stored lease
        with ``replayed`` true (the receipt is kept with the lease, atomically, with
        ``execution.attempt``, the token of this attempt of the execution, ``None`` for an
        anonymous one). Whether a stored receipt replays is
        :func:`prefect_baton._rules.core.replay_check`'s decision: only the same attempt
        replays; another one gets ``IdempotencyInFlightError`` while the lease is held and a
        new generation once it is not.

        Raises:
            ConflictError: held by another execution, or a write scope overlaps.
            VersionConflictError: ``expected_version`` is stale.
            IdempotencyMismatchError: the key was used for another request.
            IdempotencyInFlightError: another attempt of the execution holds the lease.
            LeaseLostError: a replay whose lease was since lost.
        """
        ...

    def acquire_many(
        self, caller: Caller, requests: Sequence[AcquireRequest], execution: Execution
    ) -> list[Lease]:
        """Acquire every resource of ``requests`` (1..:data:`MAX_MANY`, distinct) or none,
        in one transaction, script or request; each decided exactly as :meth:`acquire`
        decides it, under the same ``execution`` (key and attempt).

        Returns:
            The leases in request order (``replayed`` for those already held by this
            execution or replayed).

        Raises:
            The error :meth:`acquire` would raise for the first refused request, its
            message ending ``(acquire_many item <index>: <type>/<id>)``; nothing is written.
            ValidationError: no request or more than :data:`MAX_MANY`.
        """
        ...

    def renew(
        self, caller: Caller, request: RenewRequest, *, idempotency: Idempotency | None = None
    ) -> Lease:
        """Extend the lease ``request.proof`` names to the authority's now +
        ``request.ttl_ms`` (rules: :func:`prefect_baton._rules.transitions.decide_renew`);
        ``idempotency``: see :class:`Idempotency` (operation ``renew``).

        Raises:
            LeaseLostError: ended or expired. NotFoundError: not the caller's lease.
            VersionConflictError: ``expected_version`` differs.
            IdempotencyMismatchError, IdempotencyInFlightError: see :class:`Idempotency`.
        """
        ...

    def transfer(
        self, caller: Caller, request: TransferRequest, *, idempotency: Idempotency | None = None
    ) -> Lease:
        """Hand the lease ``request.proof`` names to ``request.to_principal`` under its new
        execution key for its ``ttl_ms`` (rules:
        :func:`prefect_baton._rules.transitions.decide_transfer`); returns the receiver's lease.

        Raises:
            As :meth:`renew`, plus ValidationError: the execution key is not new.
        """
        ...

    def release(
        self, caller: Caller, request: ReleaseRequest, *, idempotency: Idempotency | None = None
    ) -> Receipt:
        """Release the lease ``request.proof`` names (rules:
        :func:`prefect_baton._rules.transitions.decide_release`); status ``released``, ``expired``
        or ``no_change`` (already released by this proof).

        Raises:
            LeaseLostError: another holder took it since. NotFoundError: not the caller's.
            VersionConflictError, IdempotencyMismatchError, IdempotencyInFlightError.
        """
        ...

    def release_by_id(
        self, caller: Caller, lease_id: str, *, idempotency: Idempotency | None = None
    ) -> Receipt:
        """Release the caller's lease ``lease_id`` by id alone.

        Raises:
            NotFoundError: released, unknown, or another principal's or org's lease.
            IdempotencyMismatchError, IdempotencyInFlightError.
        """
        ...

    def force_release(
        self, caller: Caller, lease_id: str, *, idempotency: Idempotency | None = None
    ) -> Receipt:
        """Release any lease of the caller's org (``owner``/``admin`` only).

        Raises:
            ForbiddenError: the caller is an ``agent``. NotFoundError: not active/unknown.
            IdempotencyMismatchError, IdempotencyInFlightError.
        """
        ...

    def inspect(self, caller: Caller, resource_type: str, resource_id: str) -> LeaseInfo:
        """Whether the resource is held, until when, its version and epoch (the holder
        also gets its lease), judged on the authority's clock."""
        ...

    def get(self, caller: Caller, lease_id: str) -> Lease:
        """A lease generation by id: the caller's (any of the org's for owner/admin).

        Raises:
            NotFoundError: unknown, another org's, or another principal's.
        """
        ...

    def list_leases(self, caller: Caller, query: LeaseQuery) -> list[Lease]:
        """Effective leases of the caller (``query.owner``: a principal or ``"*"``, needs
        owner/admin), newest first (by acquire time in ms, then lease id, both
        descending), at most ``query.limit``; ``query.include_ended`` adds ended ones.
        ``query.after``: the ``(acquired_at ms, lease_id)`` of the last lease of the
        previous page (see :mod:`prefect_baton._rules.paging`); the page holds the leases
        after it.

        Raises:
            ForbiddenError: another principal's leases asked by an ``agent``.
        """
        ...

    def handoff_resolve(
        self, caller: Caller, request: ResolveRequest, *, idempotency: Idempotency | None = None
    ) -> Handoff:
        """Accept or reject (``request.status``) a pending handoff addressed to the
        caller; accepting one that carries a lease transfers it to the caller under
        ``request.execution_key`` (default ``handoff:<id>``) for ``request.ttl_ms``
        (default: the sender's TTL), atomically with the status change (operation
        ``resolve``).

        Raises:
            NotFoundError: unknown, resolved, or expired. ValidationError: not its target.
            LeaseLostError: the sender's lease ended in the instant of acceptance (the
                handoff then reads ``expired``).
            IdempotencyMismatchError, IdempotencyInFlightError.
        """
        ...

    def expire_handoffs(
        self, caller: Caller, *, handoff_id: str | None = None, limit: int = 1000
    ) -> list[Lease]:
        """End pending handoffs of the caller's org that expired unaccepted (``handoff_id``:
        that one, if it did; else the oldest ``limit``, 1..10,000): each is stored
        ``expired`` and, when the lease it carries is still its sender's and effective, that
        lease is released in the same step (``lease.released``, ``reason``
        ``handoff_expired``; rules: :func:`prefect_baton._rules.handoffs.
        decide_handoff_expiry`). Idempotent. A REST store returns ``[]``: the server applies
        it on its own reads, resolves, acquires and sweeps.

        Returns:
            The carried leases this call released.
        """
        ...

    def report_expired(self, caller: Caller, *, limit: int = 1000) -> list[Lease]:
        """Record ``lease.expired`` once for each lease of the org this authority finds past
        its TTL that nobody acted on since (at most ``limit``, 1..10,000, oldest expiry
        first); returns those leases. Expiry is judged by the authority, never by a lagging
        copy of its leases.

        Raises:
            ForbiddenError: the ledger, while Redis decides the org's leases.
            UnavailableError: the authority cannot be reached.
        """
        ...

    def fence(self, caller: Caller, lease: Lease) -> Fence:
        """The fence a fenced record write (checkpoint save, outcome record) of ``lease``
        presents to the record store: its id and epoch, and with an authority other than
        the ledger, the check the ledger runs inside its write transaction.

        Raises:
            UnavailableError: the authority cannot be reached (or is rebuilding).
        """
        ...

    def ledger_barrier(self, caller: Caller) -> None:
        """Make the record store see every lease transition of ``caller.org`` this
        authority has acknowledged (read-your-writes before a record operation); nothing
        to do when the record store is the authority itself or behind the REST API.

        Raises:
            UnavailableError: the ledger cannot be written.
        """
        ...

    def close(self) -> None:
        """Release the connections this store opened (not those it was given)."""
        ...


class RecordStore(Protocol):
    """Checkpoints, handoffs, outcomes and events: the ledger
    (:class:`~prefect_baton._stores.ledger.store.LedgerStore`) or the REST API
    (:class:`~prefect_baton._stores.rest.client.RestStore`). Arguments arrive validated;
    times are milliseconds; every method raises the :mod:`prefect_baton.errors` of its rule.
    """

    @property
    def state_max_bytes(self) -> int:
        """The checkpoint state cap (``int`` bytes of JSON)."""
        ...

    def checkpoint_save(
        self, caller: Caller, write: CheckpointWrite, *, idempotency_key: str | None
    ) -> Checkpoint:
        """Write the caller's checkpoint of ``(write.subject_id, write.kind)`` (version +1);
        ``idempotency_key``: an exact retry returns the stored checkpoint with ``replayed``
        true.

        Raises:
            VersionConflictError, StaleFenceError (``fence`` is not the effective lease),
            IdempotencyMismatchError, ValidationError.
        """
        ...

    def checkpoint_delete(
        self, caller: Caller, checkpoint_id: str, *, idempotency_key: str | None
    ) -> Checkpoint:
        """Delete the caller's checkpoint: it reads as absent from then on, its history
        stays, ``checkpoint.deleted`` is recorded (rules:
        :func:`prefect_baton._rules.access.check_checkpoint_delete`); returns it as deleted.

        Raises:
            NotFoundError: unknown, deleted, expired or another org's. ForbiddenError: not
            the caller's. ConflictError: a pending handoff carries it.
            IdempotencyMismatchError.
        """
        ...

    def checkpoint_get(
        self, caller: Caller, subject_id: str, kind: str, principal: str | None = None
    ) -> Checkpoint | None:
        """The current checkpoint of ``(subject_id, principal or the caller, kind)``, or
        ``None`` (none, or expired)."""
        ...

    def checkpoint_get_by_id(self, caller: Caller, checkpoint_id: str) -> Checkpoint:
        """A checkpoint of the org by id. Raises NotFoundError: unknown or expired."""
        ...

    def checkpoint_history(self, caller: Caller, query: HistoryQuery) -> list[Checkpoint]:
        """The versions of the checkpoint ``query`` names, oldest first (by version), at
        most ``query.limit``, after ``query.after`` (empty when there is none or the caller
        may not read it)."""
        ...

    def handoff_create(
        self, caller: Caller, offer: HandoffOffer, *, idempotency_key: str | None
    ) -> Handoff:
        """Create a pending handoff to ``offer.to_principal``, optionally carrying
        ``offer.lease``; ``idempotency_key``: an exact retry returns the stored handoff.

        Raises:
            NotFoundError: the checkpoint is unknown, deleted or expired. LeaseLostError: the
                lease is not held.
            ValidationError: a handoff to oneself. IdempotencyMismatchError.
        """
        ...

    def handoff_inbox(
        self, caller: Caller, *, limit: int = 100, after: tuple[int, str] | None = None
    ) -> list[Handoff]:
        """Pending handoffs addressed to the caller, oldest first (by creation time in ms,
        then handoff id), at most ``limit``; ``after``: the ``(created_at ms, handoff_id)``
        of the last handoff of the previous page."""
        ...

    def handoff_list(self, caller: Caller, query: HandoffQuery) -> list[Handoff]:
        """Handoffs of the caller's org sent or received by ``query.party`` (default the
        caller; ``"*"``: everyone's, which like another principal's needs ``owner``/
        ``admin``) that read as ``query.status`` (``None``: any), oldest first (by creation
        time in ms, then handoff id), at most ``query.limit``; ``query.after``: the
        ``(created_at ms, handoff_id)`` of the last handoff of the previous page.

        Raises:
            ForbiddenError: another principal's or everyone's handoffs asked by an
                ``agent``.
        """
        ...

    def handoff_get(self, caller: Caller, handoff_id: str) -> Handoff:
        """A handoff the caller sent or received. Raises NotFoundError otherwise."""
        ...

    def outcome_record(
        self, caller: Caller, record: OutcomeWrite, *, idempotency_key: str | None
    ) -> Outcome:
        """Record an outcome of ``record.subject_id``; ``idempotency_key``: an exact retry
        returns the stored outcome.

        Raises:
            StaleFenceError, NotFoundError (a linked id), IdempotencyMismatchError.
        """
        ...

    def outcome_list(self, caller: Caller, query: OutcomeQuery) -> list[Outcome]:
        """The outcomes of the org that ``query`` keeps (:class:`OutcomeQuery`), oldest
        first (by record time in ms, then outcome id)."""
        ...

    def events_list(self, caller: Caller, query: EventQuery) -> list[Event]:
        """The events ``query`` keeps (:class:`EventQuery`), in commit order."""
        ...

    def prune_receipts(self, caller: Caller) -> int:
        """Delete idempotency receipts past retention; returns how many.

        Raises:
            ForbiddenError: not offered by this store (the REST API).
        """
        ...

    def close(self) -> None:
        """Release the connections this store opened."""
        ...
