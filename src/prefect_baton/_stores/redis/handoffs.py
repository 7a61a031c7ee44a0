"""Handoff resolution when Redis is the lease authority.

Accepting a handoff that carries a lease spans two systems: the lease lives in Redis, the
handoff in the ledger. The protocol keeps every crash point inside the two allowed end
states, ``(pending, sender holds)`` and ``(accepted, recipient holds)``:

1. Read the handoff from the ledger and check it as the ledger would (pending, not expired,
   addressed to the caller).
2. One Redis script transfers the lease to the recipient *and* settles the handoff's
   resolution key to ``accepted`` (it refuses if the key says ``rejected``), and its journal
   entry carries the acceptance. The new lease id is derived from the handoff id, so an
   exact retry finds the transfer it already made instead of failing.
3. The reconciler applies that entry in one ledger transaction: the lease transition *and*
   the handoff's move to ``accepted`` (with ``lease.transferred`` then ``handoff.accepted``
   events). The call drains the journal up to its entry before returning.

A crash after 2 leaves Redis with the recipient holding and the ledger pending only until
any drain runs (the client's drain thread, ``baton reconcile``, the next ledger operation of
any client of the org, or an exact retry), which completes it as ``accepted``; if Redis loses
its data first, the transfer is lost with it and the rebuilt state is ``(pending, sender
holds)``. Rejecting a lease-carrying handoff first settles the resolution key to
``rejected`` (refused once it says ``accepted``), then releases the carried lease on Redis
(``_rules.core.releases_on_reject``), then records the rejection in the ledger; a crash in
between leaves the handoff pending, and no accept can win afterwards.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING

from prefect_baton._rules.access import check_resolver
from prefect_baton._rules.core import Proof, ReleaseRequest, releases_on_reject
from prefect_baton._stores.ledger.records import carried_lapsed
from prefect_baton._stores.ledger.store import handoff_model
from prefect_baton._stores.ledger.tables import HandoffRow
from prefect_baton._stores.protocol import Caller, ResolveRequest
from prefect_baton._stores.redis.codec import lease_from_gen, opt
from prefect_baton._stores.redis.connection import as_text
from prefect_baton._stores.redis.keys import HANDOFF_KEY_TTL_MS, org_keys
from prefect_baton._stores.redis.scripts import OK, REPLAY, UNKNOWN, raise_for
from prefect_baton.errors import NotFoundError
from prefect_baton.models import Handoff, Lease

if TYPE_CHECKING:
    from prefect_baton._stores.redis.authority import RedisAuthority

__all__ = ["mark_rejected", "release_carried", "resolve_handoff", "transfer_lease"]


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
        LeaseLostError: the sender no longer holds the lease (the handoff stays pending).
        UnavailableError: Redis or the ledger is unreachable.
    """
    handoff_id = resolution.handoff_id
    store = auth.store
    auth.sync_ledger(caller.org)
    with store._read() as (s, now):
        row = s.get(HandoffRow, handoff_id)
        lease_id = from_principal = expires_at_ms = None
        if row is not None and row.org_id == caller.org and row.status == "pending":
            lease_id, from_principal = row.lease_id, row.from_principal
            expires_at_ms = row.expires_at_ms
            if handoff_model(row, now, carried_lapsed=carried_lapsed(s, row, now)).status == (
                "expired"
            ):
                raise NotFoundError(f"handoff {handoff_id} has expired")
            check_resolver(row.to_principal, caller.principal)
    if lease_id is None or from_principal is None:
        return store.handoff_resolve(caller, resolution)
    if resolution.status == "rejected":
        mark_rejected(auth, caller, handoff_id)
        release_carried(auth, caller, lease_id, from_principal)
        return store.handoff_resolve(caller, resolution)
    lease = transfer_lease(
        auth,
        caller,
        handoff_id,
        lease_id=lease_id,
        from_principal=from_principal,
        execution_key=resolution.execution_key or f"handoff:{handoff_id}",
        ttl_ms=resolution.ttl_ms,
        note=resolution.note,
        expires_at_ms=expires_at_ms,
    )
    with store._read() as (s, now):
        done = s.get(HandoffRow, handoff_id)
        assert done is not None
        return handoff_model(done, now, lease)


def release_carried(auth: RedisAuthority, caller: Caller, lease_id: str, sender: str) -> None:
    """Release the lease a rejected handoff carries when
    :func:`prefect_baton._rules.core.releases_on_reject` says so (on Redis, the authority),
    then drain the journal so the ledger's rejection sees it released and leaves it alone.
    A crash in between leaves the handoff pending with its lease released: accepting it is
    then ``LEASE_LOST``, and rejecting it again completes the rejection."""
    held, now = auth.generation(caller, lease_id)
    if not releases_on_reject(held, sender, now):
        return
    assert held is not None
    as_sender = dataclasses.replace(caller, principal=sender)
    auth._release(as_sender, ReleaseRequest(Proof(held.lease_id, sender, held.execution_key)))
    auth.sync_ledger(caller.org, strict=True)


def mark_rejected(auth: RedisAuthority, caller: Caller, handoff_id: str) -> None:
    """Settle a lease-carrying handoff as rejected in Redis (before the ledger records
    it), so that no accept can transfer its lease afterwards.

    Raises:
        NotFoundError: it was accepted already.
    """
    keys = org_keys(caller.org)
    reply = auth._run(
        caller.org,
        "handoff_mark",
        [handoff_id, str(HANDOFF_KEY_TTL_MS)],
        [keys.handoff(handoff_id)],
    )
    raise_for(reply)


def transfer_lease(
    auth: RedisAuthority,
    caller: Caller,
    handoff_id: str,
    *,
    lease_id: str,
    from_principal: str,
    execution_key: str,
    ttl_ms: int | None,
    note: str | None,
    expires_at_ms: int | None,
) -> Lease:
    """Transfer a handoff's lease to its recipient (the caller) and settle the handoff
    as accepted in Redis, in one script; the journal entry carries the acceptance, so
    the ledger records the transfer and the accepted handoff in one transaction. The
    call returns once the ledger has both. An exact retry after a crash returns the
    same generation (its lease id is derived from the handoff id).

    Raises:
        NotFoundError: the handoff was rejected, or expired; the lease is unknown.
        LeaseLostError: the sender no longer holds the lease (the handoff stays pending).
    """
    keys = org_keys(caller.org)
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
            execution_key,
            "" if ttl_ms is None else str(ttl_ms),
            "",
            new_id,
            caller.principal,
            opt(handoff_id),
            opt(note),
            opt(expires_at_ms),
            str(HANDOFF_KEY_TTL_MS),
        ],
        [keys.handoff(handoff_id)],
    )
    code = int(reply[0])
    if code == OK:
        lease = lease_from_gen(reply[2])
        auth.reconciler.drain(caller.org, until=as_text(reply[1]))
        return lease
    if code == REPLAY:
        auth.sync_ledger(caller.org, strict=True)
        return lease_from_gen(reply[1])
    if code == UNKNOWN:
        raise NotFoundError(f"lease {lease_id} not found")
    raise_for(reply)
    raise AssertionError("unreachable")
