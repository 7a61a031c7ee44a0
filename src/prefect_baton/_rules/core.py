"""The pure decision core: input validation, the lease types and the acquire decision.

No I/O and no clock: every function takes ``now_ms`` (epoch milliseconds read from the
authority) and the rows it needs, and returns a decision or raises a :class:`BatonError`.
The ledger store and the Redis scripts apply these rules; the Lua scripts mirror them and
the conformance suite holds both to the same results.

Rules come from ``DESIGN.md`` ("Leases"), which merges the seed coordination service
(seed 000/003: TTL 10..86,400 s, conflicts name only the expiry, re-acquire is not renew,
release by id of a released lease is not found) and the task-lease lifecycle (seed 004:
versions, epochs, execution keys, write scopes, proof-bearing renew/transfer/release,
durable ``no_change`` release receipts, safe-integer exhaustion).

The decisions on a granted generation (renew, transfer, release by proof or by id, force
release, and expiry on release) are in :mod:`prefect_baton._rules.transitions`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

from prefect_baton._rules.scopes import ScopeConflict, scope_conflict_expiry
from prefect_baton._rules.validation import (
    DEFAULT_STATE_MAX_BYTES,
    MAX_ID_LENGTH,
    MAX_JSON_DEPTH,
    MAX_SAFE_INTEGER,
    MAX_SCOPE_LENGTH,
    MAX_SCOPES,
    MAX_TEXT_LENGTH,
    ROLES,
    TTL_MAX_SECONDS,
    TTL_MIN_SECONDS,
    canonical_json,
    request_digest,
    validate_id,
    validate_optional_id,
    validate_principal,
    validate_role,
    validate_scopes,
    validate_state,
    validate_text,
    validate_ttl,
    validate_version,
)
from prefect_baton.errors import (
    ConflictError,
    ForbiddenError,
    IdempotencyInFlightError,
    LeaseLostError,
    StaleFenceError,
    ValidationError,
    VersionConflictError,
)
from prefect_baton.models import LeaseStatus, ReceiptStatus, from_ms, wire_time

__all__ = [  # the decision core, plus the validation it re-exports for its callers
    "DEFAULT_STATE_MAX_BYTES",
    "EPOCH_RANGE",
    "MAX_ID_LENGTH",
    "MAX_JSON_DEPTH",
    "MAX_SAFE_INTEGER",
    "MAX_SCOPES",
    "MAX_SCOPE_LENGTH",
    "MAX_TEXT_LENGTH",
    "ROLES",
    "TTL_MAX_SECONDS",
    "TTL_MIN_SECONDS",
    "AcquireRequest",
    "Decision",
    "Generation",
    "Proof",
    "ReleaseRequest",
    "RenewRequest",
    "Status",
    "TransferRequest",
    "canonical_json",
    "check_checkpoint_version",
    "check_fence",
    "check_fencing_token",
    "check_org_redis",
    "conflict",
    "decide_acquire",
    "handoff_deadline_passed",
    "in_flight",
    "incarnation_epochs",
    "lapsed",
    "next_epoch",
    "replay_check",
    "request_digest",
    "validate_id",
    "validate_optional_id",
    "validate_principal",
    "validate_role",
    "validate_scopes",
    "validate_state",
    "validate_text",
    "validate_ttl",
    "validate_version",
]

Status = LeaseStatus


# --------------------------------------------------------------------------- lease rows


@dataclass(frozen=True, slots=True)
class Generation:
    """A lease generation as the core sees it (one ledger row, one Redis hash)."""

    lease_id: str
    resource_type: str
    resource_id: str
    owner: str
    execution_key: str | None
    version: int
    epoch: int
    status: Status
    acquired_at_ms: int
    expires_at_ms: int
    ttl_ms: int = 0
    scopes: tuple[str, ...] = ()
    purpose: str | None = None
    ended_at_ms: int | None = None
    ended_by: str | None = None

    def effective(self, now_ms: int) -> bool:
        """Active and not yet expired on the authority's clock."""
        return self.status == "active" and self.expires_at_ms > now_ms

    def lapsed(self, now_ms: int) -> bool:
        """Still active on its record but past its TTL on the authority's clock: what
        ``report_expired`` reports (nobody has acted on it since it expired)."""
        return lapsed(self.status, self.expires_at_ms, now_ms)


def handoff_deadline_passed(deadline_ms: int | None, now_ms: int) -> bool:
    """Whether a pending handoff's own deadline (``deadline_ms``, epoch milliseconds;
    ``None``: it has none) has passed at ``now_ms`` on the authority's clock: the one rule
    of a handoff's expiry (DESIGN.md "Handoffs").

    From that moment on the handoff reads ``expired``
    (:func:`~prefect_baton._rules.handoffs.handoff_status`) and the lease it carries is over
    for every operation: a renew or transfer by the sender's proof is ``LEASE_LOST``
    (:func:`~prefect_baton._rules.transitions.decide_renew`), a write fenced by it is
    ``STALE_FENCE`` (:func:`check_fence`), whether or not anyone has yet ended the handoff
    (:func:`~prefect_baton._rules.handoffs.decide_handoff_expiry` records that, once; each
    of these refusals does it).
    Stores pass the earliest deadline of the pending handoffs carrying a lease; the Lua
    scripts mirror it as ``carried_deadline_refused`` in ``_lib.lua``.
    """
    return deadline_ms is not None and deadline_ms <= now_ms


def lapsed(status: str, expires_at_ms: int, now_ms: int) -> bool:
    """A lease whose record says ``active`` (``status``) but whose expiry
    (``expires_at_ms``, epoch milliseconds) is not after ``now_ms``: expired, though
    nobody has ended the generation yet."""
    return status == "active" and expires_at_ms <= now_ms


@dataclass(frozen=True, slots=True)
class Proof:
    """What a caller presents to act on its lease: id, owner, execution key, version."""

    lease_id: str
    owner: str
    execution_key: str | None


class AcquireRequest(NamedTuple):
    """An acquire of one resource (:func:`decide_acquire`; one resource of
    ``acquire_many``; validated by the client; a named tuple, as cheap to make as a tuple).

    Attributes: ``resource_type``, ``resource_id`` (``str``), ``ttl_ms`` (``int``,
    milliseconds), ``scopes`` (normalised globs), ``purpose``, ``expected_version``.
    """

    resource_type: str
    resource_id: str
    ttl_ms: int
    scopes: tuple[str, ...] = ()
    purpose: str | None = None
    expected_version: int | None = None


@dataclass(frozen=True, slots=True)
class RenewRequest:
    """A renewal (validated by the client; decided by
    :func:`~prefect_baton._rules.transitions.decide_renew`).

    Attributes:
        proof: names the lease, held by the caller under its execution key.
        ttl_ms: the new TTL from the authority's now (``int``, milliseconds).
        expected_version: compare-and-swap on the lease version (``VersionConflictError``
            when it differs), or ``None``.
    """

    proof: Proof
    ttl_ms: int
    expected_version: int | None = None


@dataclass(frozen=True, slots=True)
class ReleaseRequest:
    """A release by proof (validated by the client; decided by
    :func:`~prefect_baton._rules.transitions.decide_release`): ``proof`` and
    ``expected_version`` as in :class:`RenewRequest`."""

    proof: Proof
    expected_version: int | None = None


@dataclass(frozen=True, slots=True)
class TransferRequest:
    """A transfer (validated by the client; decided by
    :func:`~prefect_baton._rules.transitions.decide_transfer`).

    Attributes:
        proof: names the lease, held by the caller (the sender) under its execution key.
        to_principal: the receiving principal (``str`` id).
        new_execution_key: the receiver's execution key (``str``); it must differ from the
            sender's (else ``ValidationError``).
        ttl_ms: the receiver's TTL (``int``, milliseconds).
        expected_version: compare-and-swap on the lease version (``VersionConflictError``
            when it differs), or ``None``.
    """

    proof: Proof
    to_principal: str
    new_execution_key: str
    ttl_ms: int
    expected_version: int | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of a lease decision.

    ``ended`` is the previous generation with its new terminal status (to be written back),
    ``new`` the generation to insert or update, ``action`` the transition's name for the
    history and the event stream, and ``noop`` true when nothing must be written.
    """

    action: str
    new: Generation | None = None
    ended: Generation | None = None
    receipt_status: Literal["ok", ReceiptStatus] = "ok"
    noop: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def conflict(expires_at_ms: int, what: str = "Resource", *, by: str = "principal") -> ConflictError:
    """The conflict error: says only that the resource is taken and until when (``by`` is
    ``execution`` when the holder is another execution of the caller's own principal)."""
    exp = from_ms(expires_at_ms)
    assert exp is not None
    return ConflictError(
        f"{what} is leased by another {by} until {wire_time(exp)}.", expires_at=exp
    )


EPOCH_RANGE = 2**32
"""Epochs granted in incarnation ``n`` of a Redis authority lie in ``(n * 2**32, (n + 1) *
2**32)``."""


def next_epoch(head_epoch: int, floor: int) -> int:
    """The epoch (fencing token) of a new generation: above the epoch of the resource's
    newest generation ``head_epoch`` (0 if never leased) and above ``floor``.

    The floor keeps fencing tokens rising when the authority may not know the newest
    epoch: after Redis lost its data it is the incarnation's floor (see
    :func:`incarnation_epochs`); the ledger passes the highest epoch it ever recorded
    for the resource.
    """
    return max(head_epoch, floor) + 1


def incarnation_epochs(n: int) -> tuple[int, int]:
    """The epoch floor and ceiling of incarnation ``n`` (``int`` from 0) of an org's Redis
    lease state: every epoch granted in it is above the floor and below the ceiling, and
    the next incarnation's floor is this one's ceiling, so epochs keep rising across a
    loss of Redis data."""
    return n * EPOCH_RANGE, (n + 1) * EPOCH_RANGE


def check_org_redis(org: str, recorded: str | None, here: str | None, *, hand_back: bool) -> None:
    """Refuse a client whose Redis server is not the one the ledger records as deciding the
    leases of ``org``.

    Args:
        org: the org (``str``, named in the message).
        recorded: the address the ledger recorded with the org's Redis incarnation
            (``host:port/db`` or ``unix:path/db``; ``None``: none recorded, or the org is
            the ledger's).
        here: the address of the client's own Redis server (``None`` when it cannot be
            told: a Redis Cluster client, a client whose connections are not redis-py's
            socket connections); ``None`` on either side passes.
        hand_back: the client hands the org back to the ledger (``baton reconcile
            --return-to-ledger``, the message names ``--force``) rather than rebuilding
            the org's state on its Redis (the message names the remedy for that).

    Raises:
        ForbiddenError: both addresses are known and differ.
    """
    if recorded is None or here is None or recorded == here:
        return
    if hand_back:
        raise ForbiddenError(
            f"the leases of org {org!r} are decided by the Redis at {recorded}, not this "
            f"one ({here}): hand the org back through that Redis, or, if it is gone for "
            "good, again with --force"
        )
    raise ForbiddenError(
        f"the leases of org {org!r} are decided by the Redis at {recorded} and this "
        f"client's Redis ({here}) has no state for the org: every client of an org "
        "must use the same Redis (check BATON_REDIS_URL); if that Redis is gone for "
        "good, hand the org back to the ledger with 'baton reconcile "
        "--return-to-ledger' on this Redis, then use it"
    )


def _check_counters(head: Generation | None, *, epoch_too: bool) -> None:
    if head is None:
        return
    if head.version >= MAX_SAFE_INTEGER or (epoch_too and head.epoch >= MAX_SAFE_INTEGER):
        raise ValidationError(
            "lease generation counters are exhausted (2**53 - 1); only release is allowed"
        )


def _check_version(current: int, expected: int | None) -> None:
    if expected is not None and expected != current:
        raise VersionConflictError(
            f"expected version {expected}, current version is {current}",
            current_version=current,
            expected_version=expected,
        )


def decide_acquire(
    head: Generation | None,
    request: AcquireRequest,
    *,
    principal: str,
    execution_key: str | None,
    now_ms: int,
    new_lease_id: str,
    scope_conflict_expires_ms: ScopeConflict = None,
    epoch_floor: int = 0,
) -> Decision:
    """Decide an acquire or takeover of the resource whose newest generation is ``head``.

    Args:
        head: newest generation of the resource (any status), ``None`` if never leased.
        request: the resource, TTL, scopes, purpose and expected version asked for.
        principal, execution_key: who acquires, under which execution key (``None``:
            none); ``now_ms``: the authority's clock (epoch milliseconds);
            ``new_lease_id``: the id of a new generation.
        scope_conflict_expires_ms: expiry of another principal's effective lease whose scopes
            overlap ``request.scopes``, or ``None``, or a function finding it out, called
            only once the other checks passed
            (:func:`~prefect_baton._rules.scopes.scope_conflict_expiry`).
        epoch_floor: the new epoch is at least ``epoch_floor + 1`` (see
            :func:`next_epoch`: the incarnation's floor after Redis data loss; the ledger
            passes the highest epoch it recorded for the resource).

    Returns:
        A :class:`Decision`: ``noop`` when the same execution already holds it (``new`` is
        the current generation), else ``new`` is the generation to insert and ``ended`` the
        previous one with status ``superseded`` or ``taken_over``.

    Raises:
        ConflictError: another holder (or another execution of the same principal) holds an
            effective lease, or a scope overlaps another principal's effective lease.
        VersionConflictError: ``request.expected_version`` differs from the current version (0 when
            never leased).
        ValidationError: counters exhausted, or the scope check ran out of steps.
    """
    ended: Generation | None = None
    action = "acquire"
    if head is not None and head.effective(now_ms):
        same_owner = head.owner == principal
        if same_owner and execution_key is not None and head.execution_key == execution_key:
            return Decision(action="acquire", new=head, noop=True)
        if same_owner and execution_key is None and head.execution_key is None:
            ended = replace(head, status="superseded", ended_at_ms=now_ms)
            action = "supersede"
        else:
            raise conflict(head.expires_at_ms, by="execution" if same_owner else "principal")
    current_version = head.version if head is not None else 0
    _check_version(current_version, request.expected_version)
    if (expires := scope_conflict_expiry(scope_conflict_expires_ms)) is not None:
        raise conflict(expires, "A write scope")
    _check_counters(head, epoch_too=True)
    if head is not None and head.status == "active" and ended is None:
        ended = replace(head, status="taken_over", ended_at_ms=now_ms)
        action = "takeover"
    epoch = next_epoch(head.epoch if head is not None else 0, epoch_floor)
    new = Generation(
        lease_id=new_lease_id,
        resource_type=request.resource_type,
        resource_id=request.resource_id,
        owner=principal,
        execution_key=execution_key,
        version=current_version + 1,
        epoch=epoch,
        status="active",
        acquired_at_ms=now_ms,
        expires_at_ms=now_ms + request.ttl_ms,
        ttl_ms=request.ttl_ms,
        scopes=request.scopes,
        purpose=request.purpose,
    )
    return Decision(action=action, new=new, ended=ended)


def check_fence(
    row: Generation | None,
    *,
    lease_id: str,
    epoch: int,
    now_ms: int,
    principal: str | None = None,
    handoff_deadline_ms: int | None = None,
) -> Generation:
    """Check a write fenced by a lease: the generation must still be the effective one, and
    (when ``principal`` is given) held by the writer: a write is fenced by *its own* lease.

    ``handoff_deadline_ms``: the earliest deadline (epoch ms) of the pending handoffs
    carrying the lease, or ``None``; once it passed the lease is over
    (:func:`handoff_deadline_passed`).

    Raises:
        StaleFenceError: the lease is unknown, another principal's, ended, expired, past the
            deadline of a handoff carrying it, or its epoch is not the one presented.
    """
    if row is None or (principal is not None and row.owner != principal):
        raise StaleFenceError(f"fence lease {lease_id} is not a current lease of the writer")
    if row.epoch != epoch:
        raise StaleFenceError(
            f"fence lease {lease_id} does not have epoch {epoch}: a fence names a lease and "
            "the epoch it was granted with"
        )
    if not row.effective(now_ms) or handoff_deadline_passed(handoff_deadline_ms, now_ms):
        raise StaleFenceError(
            f"fence lease {lease_id} (epoch {epoch}) is no longer the effective lease of "
            f"{row.resource_type}/{row.resource_id}"
        )
    return row


def check_fencing_token(highest: int | None, token: int, *, resource: str) -> int:
    """The rule of a guard where a write lands, outside the lease authority (the user's own
    table, HTTP service or object store): a write may land under fencing token ``token``
    (a lease's epoch) unless a higher token has already written there.

    Equal passes: one holder writes many times under one epoch. Lower fails: a newer holder
    of the resource has written, so the writer's lease has ended even if the writer has not
    noticed (a paused process, a delayed request). Epochs rise per resource for all time
    (DESIGN.md "Leases"), so the highest token seen is the newest holder's.

    Args:
        highest: the highest token that has written to the resource (``int``), ``None`` if
            none has.
        token: the writer's token (``int``, validated by the caller).
        resource: the resource as named in the error message (``str``).

    Returns:
        The highest token once this write lands: ``max(highest, token)``.

    Raises:
        StaleFenceError: ``token`` is lower than ``highest``.
    """
    if highest is None:
        return token
    if token < highest:
        raise StaleFenceError(
            f"fencing token {token} of {resource} is stale: token {highest} has written there "
            "since (a newer holder took the lease)"
        )
    return max(highest, token)


def _lost_reason(row: Generation, now_ms: int) -> str:
    if row.status == "active" and row.expires_at_ms <= now_ms:
        return "expired"
    return row.status


def in_flight(execution_key: str | None, expires_at_ms: int) -> IdempotencyInFlightError:
    """The refusal of an attempt of an execution while another attempt of it holds the lease
    (until ``expires_at_ms``, epoch milliseconds), see :func:`replay_check`."""
    until = from_ms(expires_at_ms)
    assert until is not None
    return IdempotencyInFlightError(
        f"execution key {execution_key!r} is held by another attempt of this execution "
        f"until {wire_time(until)}; retry after it ends or expires"
    )


def replay_check(
    row: Generation | None,
    *,
    lease_id: str,
    owner: str,
    execution_key: str | None,
    epoch: int,
    now_ms: int,
    attempt: str | None = None,
    receipt_attempt: str | None = None,
) -> Generation | None:
    """Decide a keyed acquire whose execution key already has an acquire receipt (same
    request digest) for lease ``lease_id`` at ``epoch``, made by attempt ``receipt_attempt``.

    An *attempt* is one try of an execution (DESIGN.md "Leases": two attempts of one
    execution never both hold it). Attempts are the same when the tokens are equal
    (``None``, an anonymous attempt, equals only ``None``). A receipt is history, not
    authority (seed 004 replay rule):

    - the receipt's lease is still held by the execution (same owner, key and epoch,
      effective): the same attempt replays it; another attempt is refused, the lease being
      held by a live attempt (:class:`IdempotencyInFlightError`);
    - it was transferred (a handoff carrying it was accepted, or the holder transferred
      it): the execution's work went with it to the recipient, so no attempt of the
      execution acquires the resource again under this key (:class:`LeaseLostError` with
      status ``transferred``, whatever the attempt: otherwise a second process of the
      execution would do the work the recipient does);
    - it is no longer held otherwise (released, revoked, expired, taken over): the same
      attempt's replay does not revive it (:class:`LeaseLostError`); another attempt
      acquires afresh (``None``: decide with :func:`decide_acquire`, a new generation with a
      new epoch, and replace the receipt).

    Returns:
        The generation to return as replayed, or ``None`` to acquire afresh.

    Raises:
        IdempotencyInFlightError: another attempt of the execution holds the lease.
        LeaseLostError: this attempt's lease is no longer held, or any attempt's when it
            was transferred.
    """
    held = (
        row is not None
        and row.owner == owner
        and row.execution_key == execution_key
        and row.epoch == epoch
        and row.effective(now_ms)
    )
    same_attempt = attempt == receipt_attempt
    if held:
        assert row is not None
        if same_attempt:
            return row
        raise in_flight(execution_key, row.expires_at_ms)
    why = "gone" if row is None else _lost_reason(row, now_ms)
    if not same_attempt and why != "transferred":
        return None
    raise LeaseLostError(
        f"lease {lease_id} acquired under this execution key is no longer held ({why}); "
        "a replayed receipt does not revive it: use a new execution key",
        status=why,
    )


def check_checkpoint_version(current: int, expected: int | None) -> None:
    """Compare-and-swap on a checkpoint: ``expected`` must equal ``current`` (0 if none)."""
    _check_version(current, expected)
