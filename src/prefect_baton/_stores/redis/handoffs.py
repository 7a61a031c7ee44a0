"""Handoff resolution when Redis is the lease authority.

Accepting a handoff that carries a lease spans two systems: the lease lives in Redis, the
handoff in the ledger. The protocol keeps every crash point inside the two allowed end
states, ``(pending, sender holds)`` and ``(accepted, recipient holds)``:

1. Read the handoff from the ledger and check it as the ledger would (pending, not expired,
   addressed to the caller).
2. One Redis script transfers the lease to the recipient *and* settles the handoff's
   resolution (kept in the org's ``rc`` hash) to ``accepted`` (it refuses if the resolution
   says ``rejected``), and its journal
   entry carries the acceptance. The new lease id is derived from the handoff id, so an
   exact retry finds the transfer it already made instead of failing.
3. The reconciler applies that entry in one ledger transaction: the lease transition *and*
   the handoff's move to ``accepted`` (with ``lease.transferred`` then ``handoff.accepted``
   events). The call drains the journal up to its entry before returning. Another accept
   that finds the handoff already accepted in Redis gets that lease back only under the
   same explicit execution key (a retry of that execution); any other is ``NOT_FOUND``.

A crash after 2 leaves Redis with the recipient holding and the ledger pending only until
any drain runs (the client's drain thread, ``baton reconcile``, the next ledger operation of
any client of the org, or an exact retry), which completes it as ``accepted``; if Redis loses
its data first, the transfer is lost with it and the rebuilt state is ``(pending, sender
holds)``; an accept that finds its entry gone so is answered ``UNAVAILABLE`` (retry), never
with the lost lease. Rejecting a lease-carrying handoff first settles the resolution to
``rejected`` (refused once it says ``accepted``), then releases the carried lease on Redis
(``_rules.handoffs.decide_carried_release``), then records the rejection in the ledger; a
crash in between leaves the handoff pending, and no accept can win afterwards. The mark
is refused past the handoff's deadline (Redis clock) and names the rejecting call: that
call is the one answered as the rejection. A handoff so marked ends ``rejected``, never
``expired``: another reject or an accept (answered ``NOT_FOUND``), a read or the expiry
sweep that finds it marked completes it, and the rejecting call, finding it recorded,
still answers it as its own.

A handoff that expired unaccepted (:func:`expire_handoff`, ``_rules.handoffs.
decide_handoff_expiry`` judged on the Redis clock and the generation Redis holds) releases
its carried lease on Redis, then is stored ``expired`` in the ledger. No accept can win
after the deadline: ``transfer.lua`` refuses it on the same Redis clock; an accept before
the deadline moved the lease to a new generation first, which the rule leaves alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prefect_baton._rules.access import check_resolver
from prefect_baton._rules.core import Generation, Proof, ReleaseRequest
from prefect_baton._rules.events import RELEASE_HANDOFF_EXPIRED, RELEASE_HANDOFF_REJECTED
from prefect_baton._rules.handoffs import (
    carried_lease_ended,
    decide_carried_release,
    decide_handoff_expiry,
    expired_message,
)
from prefect_baton._stores.ledger.expiry import carried
from prefect_baton._stores.ledger.store import handoff_model
from prefect_baton._stores.ledger.tables import HandoffRow
from prefect_baton._stores.protocol import Caller, ResolveRequest
from prefect_baton._stores.redis.codec import lease_from_gen, opt
from prefect_baton._stores.redis.connection import as_text
from prefect_baton._stores.redis.keys import HANDOFF_KEY_TTL_MS, OrgKeys, org_keys
from prefect_baton._stores.redis.scripts import OK, REPLAY, UNKNOWN, raise_for
from prefect_baton.errors import LeaseLostError, NotFoundError, UnavailableError
from prefect_baton.models import Handoff, Lease

if TYPE_CHECKING:
    from prefect_baton._stores.redis.authority import RedisAuthority

__all__ = [
    "end_carriers",
    "expire_handoff",
    "lease_carriers",
    "mark_rejected",
    "release_carried",
    "resolve_handoff",
    "run_carried",
    "transfer_lease",
]

log = logging.getLogger("prefect_baton.redis")

#: How long the answer of :func:`lease_carriers` is trusted (seconds; below the shortest
#: handoff expiry, 1 s, so that no deadline is missed).
LEASE_CARRIERS_RECHECK_SECONDS = 0.5


def resolve_handoff(auth: RedisAuthority, caller: Caller, resolution: ResolveRequest) -> Handoff:
    """Resolve a handoff with Redis as the lease authority (see the module docstring).

    Args:
        auth: the Redis authority; its ledger holds the handoff.
        caller: the recipient.
        resolution: the handoff id, ``accepted`` or ``rejected`` (validated), the note kept
            with it, the recipient's execution key for the lease (default
            ``handoff:<id>``) and its TTL in ms (default: the sender's).

    Raises:
        NotFoundError: unknown, not pending, expired, or another org's handoff.
        ValidationError: the caller is not its target (the seed's message).
        LeaseLostError: the sender's lease ended between the check and the transfer (the
            handoff then reads ``expired``).
        UnavailableError: Redis or the ledger is unreachable, or Redis lost its data
            between the transfer and its drain into the ledger (the transfer is lost with
            it; the handoff is still pending and a retry can accept it).
    """
    handoff_id = resolution.handoff_id
    store = auth.store
    auth.sync_ledger(caller.org)
    expired: str | None = None  # the message, when it reads expired
    with store._read() as (s, now):
        row = s.get(HandoffRow, handoff_id)
        lease_id = from_principal = expires_at_ms = None
        recipient = caller.principal  # who may resolve it (checked below)
        if row is not None and row.org_id == caller.org and row.status == "pending":
            lease_id, from_principal = row.lease_id, row.from_principal
            expires_at_ms = row.expires_at_ms
            held = carried(s, row)
            ended = carried_lease_ended(held, now)
            if handoff_model(row, now, carried_ended=ended).status == "expired":
                expired = expired_message(handoff_id, row.expires_at_ms, held, now)
            else:
                check_resolver(row.to_principal, caller.principal)
    if expired is not None:
        # end it first: releasing its lease, or completing the rejection that settled it
        # in Redis (mark_rejected) and released its lease (expire_handoff)
        marked = rejection_marked(auth, caller, handoff_id)
        expire_handoff(auth, caller, handoff_id)
        raise NotFoundError(f"handoff {handoff_id} was rejected" if marked else expired)
    if lease_id is None or from_principal is None:
        return store.handoff_resolve(caller, resolution)
    if resolution.status == "rejected":
        if not mark_rejected(auth, caller, handoff_id, expires_at_ms):
            # another rejection settled it first: that one is answered as the rejection,
            # this one as a second resolve (completing the first if it was interrupted)
            complete_rejection(auth, caller, handoff_id, lease_id, from_principal, recipient)
            raise NotFoundError(f"pending handoff {handoff_id} not found")
        released = release_carried(auth, caller, handoff_id, lease_id, from_principal)
        try:
            rejected = store._handoff_resolve(caller, resolution, carried_released=True)
        except NotFoundError:
            # the expiry sweep (or a read ending it) recorded this call's rejection first
            with store._read() as (s, now):
                row = s.get(HandoffRow, handoff_id)
                if row is None or row.status != "rejected":
                    raise
                rejected = handoff_model(row, now)
        if released is None:
            return rejected
        return rejected.model_copy(update={"released_lease": released})
    lease = transfer_lease(
        auth,
        caller,
        handoff_id,
        lease_id=lease_id,
        from_principal=from_principal,
        execution_key=resolution.execution_key,
        ttl_ms=resolution.ttl_ms,
        note=resolution.note,
        expires_at_ms=expires_at_ms,
    )
    with store._read() as (s, now):
        done = s.get(HandoffRow, handoff_id)
        assert done is not None
        if done.status != "accepted":
            # the drain found the journal without the transfer's entry: Redis lost it (and
            # the transfer) before it reached the ledger; the rebuilt state is (pending,
            # sender holds), so the lease in hand is not the recipient's
            raise UnavailableError(
                f"the acceptance of handoff {handoff_id} was lost with Redis's data before "
                "it reached the ledger; the handoff is still pending: retry"
            )
        return handoff_model(done, now, lease)


def release_carried(
    auth: RedisAuthority, caller: Caller, handoff_id: str, lease_id: str, sender: str
) -> Lease | None:
    """Release the lease a rejected handoff carries when
    :func:`prefect_baton._rules.handoffs.decide_carried_release` says so, judged on the
    generation Redis holds and the Redis clock (:func:`_release_by_handoff`).

    Returns:
        The released generation, or ``None`` when nothing was released.
    """
    held, now = auth.generation(caller, lease_id)
    release = decide_carried_release(
        held,
        handoff_id=handoff_id,
        from_principal=sender,
        reason=RELEASE_HANDOFF_REJECTED,
        now_ms=now,
    )
    if release is None or held is None:
        return None
    return _release_by_handoff(auth, caller, held, sender, (handoff_id, RELEASE_HANDOFF_REJECTED))


def _release_by_handoff(
    auth: RedisAuthority, caller: Caller, held: Generation, sender: str, by: tuple[str, str]
) -> Lease | None:
    """Release ``held`` on Redis with the sender's proof, the journal entry naming the
    handoff and reason ``by``, then drain the journal so the ledger sees it released (and
    leaves it alone). A crash in between leaves the handoff pending with its lease released:
    it reads ``expired``, and ending it again completes it.

    Returns:
        The released generation, or ``None`` (already released, or moved on meanwhile).
    """
    as_sender = dataclasses.replace(caller, principal=sender)
    try:
        receipt = auth._release(
            as_sender,
            ReleaseRequest(Proof(held.lease_id, sender, held.execution_key)),
            by_handoff=by,
        )
    except LeaseLostError:
        return None  # taken over after its TTL meanwhile: nothing to release
    auth.sync_ledger(caller.org, strict=True)
    return None if receipt.status == "no_change" else receipt.lease


def expire_handoff(auth: RedisAuthority, caller: Caller, handoff_id: str) -> Lease | None:
    """End handoff ``handoff_id`` if it expired unaccepted
    (:func:`prefect_baton._rules.handoffs.decide_handoff_expiry`, judged on the Redis clock
    and the generation Redis holds): release its carried lease on Redis, drain the journal
    (an acceptance made before the deadline reaches the ledger first), then store it
    ``expired`` in the ledger. Idempotent: a handoff no longer pending, or a lease already
    released, is left as it is.

    Returns:
        The carried lease released by this call, or ``None``. A handoff marked rejected in
        Redis (:func:`rejection_marked`) is completed as rejected instead.
    """
    store = auth.store
    with store._read() as (s, _now):
        row = s.get(HandoffRow, handoff_id)
        if row is None or row.org_id != caller.org or row.status != "pending":
            return None
        lease_id, sender, expires_at_ms = row.lease_id, row.from_principal, row.expires_at_ms
        recipient = row.to_principal
    if lease_id is not None and rejection_marked(auth, caller, handoff_id):
        return complete_rejection(auth, caller, handoff_id, lease_id, sender, recipient)
    released = None
    if lease_id is not None:
        held, now = auth.generation(caller, lease_id)
        if held is not None:  # unknown to Redis (long ended): the ledger's copy decides below
            expiry = decide_handoff_expiry(
                handoff_id,
                "pending",
                expires_at_ms,
                carried=held,
                from_principal=sender,
                now_ms=now,
            )
            if expiry is None:
                return None  # not expired on the Redis clock: an accept may still win
            if expiry.release is not None:
                by = (handoff_id, RELEASE_HANDOFF_EXPIRED)
                released = _release_by_handoff(auth, caller, held, sender, by)
        auth.sync_ledger(caller.org, strict=True)
    store.expire_handoffs(caller, handoff_id=handoff_id, release=False)
    return released


def complete_rejection(
    auth: RedisAuthority,
    caller: Caller,
    handoff_id: str,
    lease_id: str,
    sender: str,
    recipient: str,
) -> Lease | None:
    """Complete the rejection settled in Redis (:func:`rejection_marked`) of pending handoff
    ``handoff_id``, which carries ``lease_id`` from ``sender`` to ``recipient``: release the
    lease (if that rejection has not yet) and record the handoff ``rejected`` in the ledger,
    as the rejecting call would; idempotent. For a rejection interrupted after it settled
    (a crash), or still under way when another resolve or the expiry sweep comes: the
    rejecting call, when alive, then finds it recorded and answers it as its own.

    Returns:
        The carried lease released by this call, or ``None``.
    """
    freed = release_carried(auth, caller, handoff_id, lease_id, sender)
    as_recipient = dataclasses.replace(caller, principal=recipient)
    try:
        auth.store._handoff_resolve(
            as_recipient, ResolveRequest(handoff_id, "rejected"), carried_released=True
        )
    except NotFoundError:
        pass  # recorded first by the rejecting call, or by another completion
    return freed


def rejection_marked(auth: RedisAuthority, caller: Caller, handoff_id: str) -> bool:
    """Whether lease-carrying handoff ``handoff_id`` was settled as rejected in Redis
    (:func:`mark_rejected`, which refuses past the handoff's deadline): a rejection is under
    way, or was interrupted before the ledger recorded it. Such a handoff ends
    ``rejected``, not ``expired``, even once its deadline has passed. (A resolution kept
    past its 7 days until it is pruned still reads here: it is still true.)"""
    keys = org_keys(caller.org)
    reply = auth.client.hget(keys.base.kept, keys.handoff_field(handoff_id))
    return reply is not None and as_text(reply).startswith("r")


def mark_rejected(
    auth: RedisAuthority, caller: Caller, handoff_id: str, expires_at_ms: int | None = None
) -> bool:
    """Settle a lease-carrying handoff as rejected in Redis (before the ledger records
    it), so that no accept can transfer its lease afterwards; refused past the handoff's
    deadline ``expires_at_ms`` (epoch ms, ``None``: none) on the Redis clock, as an accept
    is (``transfer.lua``).

    Returns:
        ``True`` when this call settled it (its rejection decides how the handoff ends),
        ``False`` when another rejection had settled it first.

    Raises:
        NotFoundError: it was accepted already, or its deadline has passed.
    """
    reply = auth._run(
        caller.org,
        "handoff_mark",
        [
            handoff_id,
            str(HANDOFF_KEY_TTL_MS),
            opt(expires_at_ms),
            secrets.token_hex(8),
            OrgKeys.handoff_field(handoff_id),
        ],
    )
    raise_for(reply)
    return int(reply[1]) == 1


def transfer_lease(
    auth: RedisAuthority,
    caller: Caller,
    handoff_id: str,
    *,
    lease_id: str,
    from_principal: str,
    execution_key: str | None,
    ttl_ms: int | None,
    note: str | None,
    expires_at_ms: int | None,
) -> Lease:
    """Transfer a handoff's lease to its recipient (the caller) under ``execution_key``
    (``None``: ``handoff:<id>``) and settle the handoff as accepted in Redis, in one
    script; the journal entry carries the acceptance, so the ledger records the transfer
    and the accepted handoff in one transaction. The call returns once the ledger has both.

    An accept that finds the handoff already accepted in Redis (its new lease id is derived
    from the handoff id) gets that generation back only when it gave the same execution key
    explicitly: the retry of one execution after a crash. Any other accept, a concurrent one
    under another key or under the default key, is ``NOT_FOUND`` like a second resolve on
    the ledger, so two runs never both hold the lease with one fencing token.

    Raises:
        NotFoundError: the handoff was rejected, expired or already accepted (by another
            execution); the lease is unknown.
        LeaseLostError: the sender no longer holds the lease (the handoff reads ``expired``).
    """
    new_id = (
        "lease_"
        + hashlib.sha256(f"handoff\x00{caller.org}\x00{handoff_id}".encode()).hexdigest()[:32]
    )
    reply = auth._run(
        caller.org,
        "transfer",
        [
            from_principal,
            caller.role,
            "",
            lease_id,
            caller.principal,
            execution_key or f"handoff:{handoff_id}",
            "" if ttl_ms is None else str(ttl_ms),
            "",
            new_id,
            caller.principal,
            opt(handoff_id),
            opt(note),
            opt(expires_at_ms),
            str(HANDOFF_KEY_TTL_MS),
            # another pending handoff carrying the lease may have passed its deadline
            opt(min((x for _h, x in lease_carriers(auth, caller, lease_id)), default=None)),
            OrgKeys.handoff_field(handoff_id),
        ],
    )
    code = int(reply[0])
    if code == OK:
        lease = lease_from_gen(reply[2])
        auth.reconciler.drain(caller.org, until=as_text(reply[1]))
        return lease
    if code == REPLAY:
        auth.sync_ledger(caller.org, strict=True)
        done = lease_from_gen(reply[1])
        if execution_key is None or done.execution_key != execution_key:
            raise NotFoundError(f"pending handoff {handoff_id} not found")
        return done
    if code == UNKNOWN:
        raise NotFoundError(f"lease {lease_id} not found")
    raise_for(reply)
    raise AssertionError("unreachable")


def run_carried(
    auth: RedisAuthority, caller: Caller, lease_id: str, run: Callable[[int | None], Lease]
) -> Lease:
    """``run`` a renew or transfer script of ``lease_id`` with the earliest deadline of the
    pending handoffs carrying it (:func:`lease_carriers`; ``None``: none), which the script
    refuses past (``LEASE_LOST``, :func:`prefect_baton._rules.core.handoff_deadline_passed`);
    on a refusal, end those handoffs as an acquire does (:func:`expire_handoff`, idempotent,
    judged on the Redis clock: the lease released once, reason ``handoff_expired``).

    Raises:
        What ``run`` raises.
    """
    carriers = lease_carriers(auth, caller, lease_id)
    try:
        return run(min((x for _h, x in carriers), default=None))
    except LeaseLostError:
        end_carriers(auth, caller, lease_id, carriers)
        raise


def end_carriers(
    auth: RedisAuthority,
    caller: Caller,
    lease_id: str,
    carriers: list[tuple[str, int]] | None = None,
) -> None:
    """After a renew, transfer or fenced write of ``lease_id`` was refused past the deadline
    of a pending handoff carrying it: end the handoffs ``carriers`` (default: those of
    :func:`lease_carriers`) that expired (:func:`expire_handoff`, idempotent, judged on the
    Redis clock: the lease released once, reason ``handoff_expired``).

    Raises:
        UnavailableError: Redis or the ledger cannot be reached.
    """
    if carriers is None:
        carriers = lease_carriers(auth, caller, lease_id)
    for handoff_id, _deadline in carriers:
        expire_handoff(auth, caller, handoff_id)
    auth._carriers_seen.pop((caller.org, lease_id), None)


def lease_carriers(auth: RedisAuthority, caller: Caller, lease_id: str) -> list[tuple[str, int]]:
    """The pending handoffs carrying ``lease_id`` with their deadlines (epoch ms), as the
    ledger has them (:meth:`LedgerStore.lease_carriers`), asked at most once per
    :data:`LEASE_CARRIERS_RECHECK_SECONDS` per lease and process. No deadline is missed: a
    handoff created after the ledger was asked expires at least 1 s later (the shortest
    handoff expiry).

    While the ledger cannot be read (``UNAVAILABLE``) the answer is "none", not an error:
    renewals of held leases go on while the ledger is down, as they did before this check
    (see ``BATON_REDIS_MAX_LAG_ENTRIES``). That cannot give the lease to a second holder: a
    handoff is accepted in the ledger, which refuses one past its deadline, and the first
    renew once the ledger answers is refused."""
    mono = time.monotonic()
    seen = auth._carriers_seen
    found = seen.get((caller.org, lease_id))
    if found is not None and found[0] > mono:
        return found[1]
    try:
        carriers = auth.store.lease_carriers(caller, lease_id)
    except UnavailableError:
        log.warning(
            "the ledger did not answer: lease %s is renewed without checking the handoffs "
            "carrying it",
            lease_id,
        )
        return []
    if len(seen) > 10_000:
        seen.clear()
    seen[(caller.org, lease_id)] = (mono + LEASE_CARRIERS_RECHECK_SECONDS, carriers)
    return carriers
