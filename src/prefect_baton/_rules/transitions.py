"""The decisions on a granted lease generation: renew, transfer, and its end by its holder
(release by proof or by id; past its TTL it ends as ``expired``) or by an owner/admin
(force release).

Pure like :mod:`prefect_baton._rules.core`, whose types (:class:`Generation`,
:class:`Decision`, the requests) and checks (versions, counters, epochs, the conflict) they
use: no I/O and no clock, every function takes ``now_ms`` and the generation it acts on.
Acquire, and the replay of an acquire receipt, are decided in :mod:`prefect_baton._rules.core`.
"""

from __future__ import annotations

from dataclasses import replace

from prefect_baton._rules.access import check_force_release
from prefect_baton._rules.core import (
    Decision,
    Generation,
    Proof,
    ReleaseRequest,
    RenewRequest,
    TransferRequest,
    _check_counters,
    _check_version,
    _lost_reason,
    conflict,
    handoff_deadline_passed,
    next_epoch,
)
from prefect_baton._rules.scopes import ScopeConflict, scope_conflict_expiry
from prefect_baton.errors import LeaseLostError, NotFoundError, ValidationError

__all__ = [
    "decide_force_release",
    "decide_release",
    "decide_release_by_id",
    "decide_renew",
    "decide_transfer",
    "no_longer_held",
    "wrong_execution_key",
]

_PASS_KEY = (
    "pass the execution key it was acquired with (in Python the Lease that acquired it "
    "carries it; --execution-key on the CLI, execution_key over REST; after a handoff "
    "accept it is handoff:<handoff id> unless another was chosen)"
)


def wrong_execution_key(lease_id: str, *, held_key: bool, given_key: bool) -> LeaseLostError:
    """The refusal of a proof naming the caller's own lease under another execution key
    than the lease's: ``LEASE_LOST`` (the generation belongs to another execution of the
    caller's principal), with a message that says the lease is the caller's and how to pass
    its key. It never shows the lease's key, nor the one given.

    Args:
        lease_id: the lease. held_key: whether the lease has an execution key.
        given_key: whether the proof gave one.
    """
    if held_key and not given_key:
        why = "under an execution key, and none was given: " + _PASS_KEY
    elif given_key and not held_key:
        why = (
            "without an execution key, but one was given: leave it out (no --execution-key on "
            "the CLI, no execution_key over REST; in Python pass the Lease that acquired it)"
        )
    else:
        why = "under a different execution key than the one given: " + _PASS_KEY
    return LeaseLostError(f"lease {lease_id} is held by you {why}")


def no_longer_held(row: Generation, now_ms: int) -> LeaseLostError:
    """The refusal of a proof naming generation ``row``, which is no longer effective at
    ``now_ms`` (epoch ms): ``LEASE_LOST`` saying how it ended (``.status``)."""
    why = _lost_reason(row, now_ms)
    return LeaseLostError(f"lease {row.lease_id} is no longer held ({why})", status=why)


def _check_proof(row: Generation | None, proof: Proof, now_ms: int) -> Generation:
    """Common proof check at ``now_ms`` (epoch ms): unknown or another principal's lease is
    not found; a wrong execution key is a lost lease: one no longer effective says so
    (:func:`no_longer_held`), else the generation belongs to another execution of the
    caller's principal (the message: :func:`wrong_execution_key`)."""
    if row is None or row.owner != proof.owner:
        raise NotFoundError(f"lease {proof.lease_id} not found")
    if row.execution_key != proof.execution_key:
        if not row.effective(now_ms):
            raise no_longer_held(row, now_ms)
        raise wrong_execution_key(
            proof.lease_id,
            held_key=row.execution_key is not None,
            given_key=proof.execution_key is not None,
        )
    return row


def _check_held(
    row: Generation | None,
    proof: Proof,
    expected_version: int | None,
    now_ms: int,
    handoff_deadline_ms: int | None = None,
) -> Generation:
    """The lease ``proof`` names, still effective at ``now_ms`` and at ``expected_version``
    (when given): what renew and transfer act on (seed 004). Raises as :func:`_check_proof`,
    then LeaseLostError (ended or expired, or ``handoff_deadline_ms``, the earliest deadline
    of a pending handoff carrying it, passed: :func:`handoff_deadline_passed`; the handoff's
    end releases it, so the status given is ``released``), VersionConflictError."""
    row = _check_proof(row, proof, now_ms)
    if not row.effective(now_ms):
        raise no_longer_held(row, now_ms)
    if handoff_deadline_passed(handoff_deadline_ms, now_ms):
        raise LeaseLostError(
            f"lease {row.lease_id} is no longer held (released: the handoff carrying it "
            "expired unaccepted)",
            status="released",
        )
    _check_version(row.version, expected_version)
    return row


def decide_renew(
    row: Generation | None,
    request: RenewRequest,
    *,
    now_ms: int,
    handoff_deadline_ms: int | None = None,
) -> Decision:
    """Decide a renewal of the generation ``row`` that ``request.proof`` names, at
    ``now_ms`` (epoch milliseconds): version +1, expiry = now + ``request.ttl_ms``; id,
    owner, key, epoch, scopes kept. ``handoff_deadline_ms``: the earliest deadline (epoch
    ms) of the pending handoffs carrying ``row``, or ``None``.

    Raises:
        NotFoundError: unknown lease id, or owned by another principal.
        LeaseLostError: the generation ended or expired (an expired lease is never silently
            re-acquired by a renew), or a handoff carrying it passed its deadline
            unaccepted (:func:`~prefect_baton._rules.core.handoff_deadline_passed`).
        VersionConflictError: ``expected_version`` differs from the lease's version.
    """
    row = _check_held(row, request.proof, request.expected_version, now_ms, handoff_deadline_ms)
    _check_counters(row, epoch_too=False)
    ttl_ms = request.ttl_ms
    new = replace(row, version=row.version + 1, expires_at_ms=now_ms + ttl_ms, ttl_ms=ttl_ms)
    return Decision(action="renew", new=new)


def decide_transfer(
    row: Generation | None,
    request: TransferRequest,
    *,
    now_ms: int,
    new_lease_id: str,
    scope_conflict_expires_ms: ScopeConflict = None,
    epoch_floor: int = 0,
    handoff_deadline_ms: int | None = None,
) -> Decision:
    """Decide a transfer of the generation ``row`` that ``request.proof`` names, at
    ``now_ms`` (epoch milliseconds): a new generation ``new_lease_id`` for
    ``request.to_principal`` under ``request.new_execution_key`` for ``request.ttl_ms``;
    version +1, epoch +1 (and above ``epoch_floor``, see :func:`next_epoch`), scopes kept
    (seed 004 transfer rule). ``scope_conflict_expires_ms``: the expiry of another
    effective lease whose scopes overlap the kept ones, or ``None``, or a function finding
    it out, called only once the proof and the new key were accepted
    (:func:`~prefect_baton._rules.scopes.scope_conflict_expiry`);
    ``handoff_deadline_ms``: as :func:`decide_renew`.

    Raises:
        NotFoundError, LeaseLostError, VersionConflictError: as :func:`decide_renew`.
        ValidationError: the new execution key equals the current one.
        ConflictError: the kept scopes overlap another effective lease of the receiver's
            competitors.
    """
    row = _check_held(row, request.proof, request.expected_version, now_ms, handoff_deadline_ms)
    if request.new_execution_key == row.execution_key:
        raise ValidationError("transfer needs a new execution key for the receiver")
    if (expires := scope_conflict_expiry(scope_conflict_expires_ms)) is not None:
        raise conflict(expires, "A write scope")
    _check_counters(row, epoch_too=True)
    ended = replace(row, status="transferred", ended_at_ms=now_ms)
    new = replace(
        row,
        lease_id=new_lease_id,
        owner=request.to_principal,
        execution_key=request.new_execution_key,
        version=row.version + 1,
        epoch=next_epoch(row.epoch, epoch_floor),
        acquired_at_ms=now_ms,
        expires_at_ms=now_ms + request.ttl_ms,
        ttl_ms=request.ttl_ms,
        status="active",
        ended_at_ms=None,
        ended_by=None,
    )
    return Decision(action="transfer", new=new, ended=ended)


def decide_release(row: Generation | None, request: ReleaseRequest, *, now_ms: int) -> Decision:
    """Decide a release of the generation ``row`` that ``request.proof`` names, at
    ``now_ms`` (epoch milliseconds; seed 004 release rule, with DESIGN.md's receipts).

    - effective lease: ``released``;
    - own lease past expiry that nobody took: cleaned up, receipt status ``expired``;
    - already released by the same proof: durable ``no_change``;
    - superseded by the holder's own re-acquire: :class:`NotFoundError` (seed service: the
      old id is not found);
    - taken over, transferred or revoked: :class:`LeaseLostError`.

    Version and epoch are kept. Raises :class:`NotFoundError` for an unknown or foreign
    lease and :class:`VersionConflictError` for a wrong ``request.expected_version``.
    """
    row = _check_proof(row, request.proof, now_ms)
    _check_version(row.version, request.expected_version)
    if row.status in ("released", "expired"):
        return Decision(action="release", new=row, receipt_status="no_change", noop=True)
    if row.status == "superseded":
        # Re-acquire is not renew: the old id is then not found (seed service rule).
        raise NotFoundError(f"lease {row.lease_id} not found")
    if row.status != "active":
        raise LeaseLostError(
            f"lease {row.lease_id} is no longer held ({row.status})", status=row.status
        )
    return _end_by_holder(row, now_ms, action="release")


def _end_by_holder(row: Generation, now_ms: int, *, action: str) -> Decision:
    if row.expires_at_ms > now_ms:
        ended = replace(row, status="released", ended_at_ms=now_ms)
        return Decision(action=action, new=ended, receipt_status="released")
    ended = replace(row, status="expired", ended_at_ms=now_ms)
    return Decision(action=action, new=ended, receipt_status="expired")


def decide_release_by_id(
    row: Generation | None, *, principal: str, lease_id: str, now_ms: int
) -> Decision:
    """Decide a release by lease id alone (the seed service's ``DELETE /v1/leases/:id``).

    Only the owner may release this way; a lease that is released, unknown, another
    principal's or in another org is not found (seed service rule).
    """
    if row is None or row.owner != principal or row.status != "active":
        raise NotFoundError(f"lease {lease_id} not found")
    return _end_by_holder(row, now_ms, action="release")


def decide_force_release(
    row: Generation | None, *, principal: str, role: str, lease_id: str, now_ms: int
) -> Decision:
    """Decide a force release: only an ``owner`` or ``admin`` of the org; the lease ends as
    ``revoked`` with who forced it. A lease that is not active is not found."""
    check_force_release(role)
    if row is None or row.status != "active":
        raise NotFoundError(f"lease {lease_id} not found")
    ended = replace(row, status="revoked", ended_at_ms=now_ms, ended_by=principal)
    return Decision(action="force_release", new=ended, receipt_status="released")
