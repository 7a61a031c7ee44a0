"""Surviving Redis data loss: the incarnation marker, the rebuild from the ledger, and the
epoch floor.

Every script first checks the org's incarnation marker (``inc``). Redis without persistence
that restarts, a ``FLUSHALL``, or a failover to an empty replica removes it, and from then on
every operation of the org is refused (fails closed, :class:`UnavailableError`) instead of
granting from empty state. The first client that notices rebuilds:

1. it takes the org's rebuild lock (other clients keep getting ``UNAVAILABLE`` meanwhile);
2. it drains whatever is left of the journal into the ledger (after a real loss nothing is
   left: then the ledger is all there is);
3. it records the next incarnation number ``n`` in the ledger (a counter kept per org, taken
   before anything is granted in that incarnation), under the org's journal lock: a drain of
   another client or process that read journal entries before the loss commits them first,
   so the ledger read of step 4 sees every grant that reached the ledger at all;
4. it clears the org's remaining Redis state (leaving each of the org's keys one pad entry;
   the acquire receipts and handoff resolutions stay when their two keys both survived)
   and loads every resource's newest generation, and the unexpired acquire receipts Redis
   no longer has, from the ledger;
5. it installs a new marker with the epoch floor ``n * 2**32`` and ceiling
   ``(n + 1) * 2**32``, only if every one of the org's keys still exists: a key evicted
   meanwhile (a Redis with an ``allkeys-*`` policy, accepted with ``allow_eviction``) would
   otherwise leave held resources looking free, so the rebuild is refused and done again.

Fencing tokens (epochs) granted after the loss are therefore greater than every token granted
before it, including tokens of transitions that the reconciler had not yet written and that
are now gone: every epoch of incarnation ``n - 1`` was below its ceiling, ``n * 2**32``, which
is the new floor. (An incarnation that uses up its range moves to the next one the same way,
see :func:`rotate`.) Generations restored from the ledger keep their ids and epochs, so their
holders can renew and release them; a transfer of one takes an epoch above the floor too.

Post-loss grant policy (``post_loss=``):

* ``"fence_only"`` (default): grant at once, relying on the higher fencing tokens. A holder
  whose grant was lost with Redis may still believe it holds the resource until its next
  renewal (which fails), while a new holder already has a greater token: a fenced store
  (the ledger's own fenced writes included) keeps only the new holder's writes.
* ``"lock_delay"``: no new grant (acquire, takeover, supersede, transfer) in the org until
  every TTL that might have been in force has run out (``lock_delay_seconds``, by default
  the largest legal TTL, 86,400 s), as Chubby does after a holder's session is lost.
  Refused grants get ``CONFLICT`` with that instant as ``expires_at``. Renewals and releases
  of restored leases still work.

What ``ack="redis"`` can lose, and what it cannot: a transition is acknowledged to the caller
once Redis has applied it and appended it to the journal; the ledger gets it when the
reconciler next drains (the lag, :meth:`Reconciler.lag`). If Redis loses its data before
that, the transitions after the last drain are lost: acquires, renewals, transfers, releases
and their receipts since then did not happen as far as the rebuilt state is concerned (a
renewal lost this way shortens a lease to its last reconciled expiry; a lost release leaves
the lease held until that expiry). What it cannot lose is ownership safety: no operation is
served from empty state, epochs granted later are greater than any granted before, fenced
ledger writes are checked against Redis (so a lost grant's holder cannot write fenced
records), and with ``lock_delay`` no one is granted a resource while a lost grant might still
be in force. With ``ack="ledger"`` no acknowledged transition is lost at all.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from sqlalchemy import and_, func, select
from sqlmodel import col

from prefect_baton._rules.core import EPOCH_RANGE, check_org_redis, incarnation_epochs
from prefect_baton._stores.ledger.authority import INCARNATION_OP, RETURNED_KEY, authority_lock
from prefect_baton._stores.ledger.leases import ATTEMPT_FIELD
from prefect_baton._stores.ledger.store import row_to_generation
from prefect_baton._stores.ledger.tables import GenerationRow, ReceiptRow
from prefect_baton._stores.redis.cluster import node_time_ms
from prefect_baton._stores.redis.codec import encode_gen, scope_meta
from prefect_baton._stores.redis.connection import as_text, server_address
from prefect_baton._stores.redis.keys import ORGS_KEY, org_keys
from prefect_baton._stores.redis.ledger_writes import journal_lock
from prefect_baton._stores.redis.scripts import OK, REBUILD_LOST
from prefect_baton.errors import UnavailableError

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from prefect_baton._stores.redis.base import AuthorityBase

__all__ = ["EPOCH_RANGE", "rebuild", "recover", "return_to_ledger", "rotate"]

log = logging.getLogger("prefect_baton.redis")

REBUILD_LOCK_MS = 120_000
RESTORE_BATCH = 200
#: Keys read per ``SCAN`` step, and dropped per script call, when a hand-back drops an org's
#: acquire receipt and handoff keys left by an earlier version (see keys.py).
SCAN_BATCH = 500


def recover(auth: AuthorityBase, org: str) -> None:
    """Handle a missing incarnation marker: rebuild (when ``auth.auto_rebuild``) or refuse.

    When another client holds the rebuild lock, wait up to ``auth.rebuild_wait_seconds`` for
    it to finish (the caller then retries its operation); nothing is granted meanwhile.

    Raises:
        UnavailableError: rebuilding is off, another client's rebuild did not finish in
            time, or the ledger or Redis failed during the rebuild.
    """
    if not auth.auto_rebuild:
        raise UnavailableError(
            f"the Redis lease state of org {org!r} is missing (Redis lost its data); "
            "operations fail until it is rebuilt from the ledger"
        )
    deadline = time.monotonic() + auth.rebuild_wait_seconds
    while True:
        try:
            rebuild(auth, org)
            return
        except RebuildInProgress:
            if time.monotonic() >= deadline:
                raise
        time.sleep(0.02)
        try:
            if auth.client.exists(org_keys(org).base.inc):
                return
        except RedisError as exc:
            raise UnavailableError(f"Redis unavailable: {exc}") from exc


class RebuildInProgress(UnavailableError):
    """Another client holds the org's rebuild lock (code ``UNAVAILABLE``)."""


def bump_incarnation(
    auth: AuthorityBase, org: str, *, decided_only: bool = False
) -> tuple[int, bool] | None:
    """Record the org's next incarnation number in the ledger and return ``(n, existed)``:
    ``n`` is 0 the first time, else the recorded number + 1 (of an org handed back to the
    ledger too: :func:`return_to_ledger`); ``existed``: Redis decided the org's leases
    until now (its state was lost, or its epoch range used up).

    With ``decided_only`` (a rotation: :func:`rotate`) nothing is written and ``None`` is
    returned unless Redis decides the org now: an org handed back meanwhile stays the
    ledger's.

    From this commit on the ledger refuses to decide the org's leases itself
    (:mod:`prefect_baton._stores.ledger.authority`): the row is written under the exclusive
    lock that every ledger lease transition takes shared, before the caller loads the
    ledger's leases into Redis. The row also records the Redis server's address
    (:func:`~prefect_baton._stores.redis.connection.server_address`).

    Raises:
        ForbiddenError: Redis decides the org and the row names another Redis server than
            ``auth``'s (a client configured with the wrong Redis URL, whose empty server
            would otherwise be rebuilt as if the org's Redis had lost its data, and grant
            beside the org's real Redis). Nothing is written.
    """
    rec = auth.reconciler
    here = server_address(auth.client)
    with auth.store.engines.write.begin() as conn:
        _lock_journal_and_authority(auth, conn, org)
        row = rec._system_row(conn, org, INCARNATION_OP)
        returned = (
            None if row is not None else rec._system_row(conn, org, INCARNATION_OP, RETURNED_KEY)
        )
        if row is None and decided_only:
            return None
        recorded = None if row is None else row.get("redis")
        if not decided_only:
            check_org_redis(org, recorded, here, hand_back=False)
        last = row or returned
        n = 0 if last is None else int(last["n"]) + 1
        now = int(conn.execute(auth.store._now_sql).scalar_one())
        address = recorded if decided_only else here
        value: dict[str, Any] = {"n": n} if address is None else {"n": n, "redis": address}
        rec._set_system_row(conn, org, INCARNATION_OP, value, now)
        if returned is not None:
            rec._delete_system_row(conn, org, INCARNATION_OP, RETURNED_KEY)
    return n, row is not None


def _lock_journal_and_authority(auth: AuthorityBase, conn: Connection, org: str) -> None:
    """Take the org's journal lock, then its authority lock, in the transaction of ``conn``
    (PostgreSQL advisory locks; SQLite's ``BEGIN IMMEDIATE`` already holds the database).

    The journal lock first, as a drain takes it (and takes no authority lock after it): a
    drain that read journal entries from Redis before Redis lost them holds the journal lock
    until their batch is committed, so the incarnation is bumped (and the ledger's leases
    are then read to rebuild Redis) only once that batch is in the ledger. Without it a
    rebuild could read the ledger while such a grant was still on its way, restore the
    resource as free, grant it to another holder with a higher epoch, and the late commit
    would then bring the earlier, lower fencing token back as the current one."""
    auth.reconciler._lock(conn, journal_lock(org))
    auth.reconciler._lock(conn, authority_lock(org))


def return_to_ledger(auth: AuthorityBase, org: str, *, force: bool = False) -> bool:
    """Hand ``org``'s leases back to the ledger (``baton reconcile --return-to-ledger``):
    clients without a Redis URL may decide them again.

    Under the org's rebuild lock: the org's incarnation marker is removed from Redis first,
    so every Redis operation of the org fails closed from then on; the journal is drained
    into the ledger (everything Redis granted is then in the ledger); the ledger's record
    that Redis decides the org (:data:`~prefect_baton._stores.ledger.authority.INCARNATION_OP`)
    is moved aside, keeping the incarnation count; the rest of the org's Redis state is
    cleared. A Redis client that uses the org later rebuilds its state from the ledger, and
    the ledger refuses to decide again from that moment, with epochs above every earlier one.

    Args:
        force: hand back also when ``auth``'s Redis has no state for the org and the ledger
            records another Redis server as the org's (``bool``): only when that server is
            gone for good; while clients still use it, it would go on granting beside the
            ledger.

    Returns:
        ``True`` when Redis decided the org's leases until now; ``False`` when the ledger
        did already (nothing changed in the ledger; the org's Redis state is cleared).

    Raises:
        ForbiddenError: without ``force``, ``auth``'s Redis has no state for the org and
            the ledger names another Redis server as the org's; nothing is changed.
        UnavailableError: another client holds the org's rebuild lock (a rebuild, or
            another hand-back), or Redis or the ledger failed (the marker may be gone from
            Redis: the next Redis operation rebuilds, and the ledger still refuses).
    """
    keys = org_keys(org)
    client = auth.client
    token = uuid.uuid4().hex
    lock_keys = [*keys.base, keys.rebuild]
    rec = auth.reconciler
    try:
        if not force and not client.exists(keys.base.inc):
            _check_same_server(auth, org)
        if not client.set(keys.rebuild, token, nx=True, px=REBUILD_LOCK_MS):
            raise RebuildInProgress(
                f"the Redis lease state of org {org!r} is being rebuilt or handed back; retry"
            )
        try:
            client.delete(keys.base.inc)  # from here every Redis operation of the org fails closed
            rec.drain(org)
            with auth.store.engines.write.begin() as conn:
                _lock_journal_and_authority(auth, conn, org)
                row = rec._system_row(conn, org, INCARNATION_OP)
                if row is not None:
                    now = int(conn.execute(auth.store._now_sql).scalar_one())
                    rec._delete_system_row(conn, org, INCARNATION_OP)
                    rec._set_system_row(conn, org, INCARNATION_OP, row, now, RETURNED_KEY)
            _check(auth.scripts["clear"](keys=lock_keys, args=[token]), org)
            # and the acquire receipt and handoff keys an earlier version kept as string
            # keys (they expire on their own, but a Redis client taking the org back must
            # find only what it rebuilds from the ledger); under the rebuild lock, so none
            # of a later incarnation is dropped
            found = client.scan_iter(match=f"{keys.prefix}[ih]:*", count=SCAN_BATCH)
            while batch := [as_text(k) for k in itertools.islice(found, SCAN_BATCH)]:
                _check(auth.scripts["clear"](keys=[*lock_keys, *batch], args=[token]), org)
            client.srem(ORGS_KEY, org)
        finally:
            try:
                auth.scripts["unlock"](keys=[keys.rebuild], args=[token])
            except RedisError:
                pass
    except RedisError as exc:
        raise UnavailableError(f"Redis unavailable while handing back org {org!r}: {exc}") from exc
    auth._known.discard(org)
    if row is not None:
        log.warning("the leases of org %r are decided by the ledger again", org)
    else:
        log.info("the leases of org %r were decided by the ledger already", org)
    return row is not None


def _check_same_server(auth: AuthorityBase, org: str) -> None:
    """Refuse to hand ``org`` back through a Redis other than the one the ledger records as
    the org's (:func:`return_to_ledger` without ``force``).

    Raises:
        ForbiddenError: the ledger records another Redis server for the org.
    """
    with auth.store.engines.read.connect() as conn:
        row = auth.reconciler._system_row(conn, org, INCARNATION_OP)
    recorded = None if row is None else row.get("redis")
    check_org_redis(org, recorded, server_address(auth.client), hand_back=True)


def _heads(auth: AuthorityBase, org: str) -> Iterator[GenerationRow]:
    newest = (
        select(
            col(GenerationRow.resource_type).label("rt"),
            col(GenerationRow.resource_id).label("ri"),
            func.max(col(GenerationRow.epoch)).label("e"),
        )
        .where(col(GenerationRow.org_id) == org)
        .group_by(col(GenerationRow.resource_type), col(GenerationRow.resource_id))
        .subquery()
    )
    q = (
        select(GenerationRow)
        .join(
            newest,
            and_(
                col(GenerationRow.resource_type) == newest.c.rt,
                col(GenerationRow.resource_id) == newest.c.ri,
                col(GenerationRow.epoch) == newest.c.e,
            ),
        )
        .where(col(GenerationRow.org_id) == org)
    )
    with auth.store._read() as (s, _now):
        yield from s.execute(q).scalars()


def _restore_args(row: GenerationRow) -> tuple[str, str]:
    h = row_to_generation(row)
    scoped = bool(h.scopes) and h.status == "active"
    gen = encode_gen(h, sid=h.lease_id if scoped else None)
    meta = scope_meta(h.resource_type, h.resource_id, h.scopes) if scoped else ""
    return gen, meta


def _restore_receipts(auth: AuthorityBase, org: str) -> int:
    keys = org_keys(org)
    n = 0
    with auth.store._read() as (s, now):
        rows = s.execute(
            select(ReceiptRow).where(
                col(ReceiptRow.org_id) == org,
                col(ReceiptRow.operation) == "acquire",
                col(ReceiptRow.expires_at_ms) > now,
            )
        ).scalars()
        pipe = auth.client.pipeline(transaction=False)
        for r in rows:
            size, _, rest = r.scope_key.partition(":")
            rt, rid = rest[: int(size)], rest[int(size) + 1 :]
            resp: dict[str, Any] = json.loads(r.response)
            rec = {"d": r.request_digest, "id": resp["lease_id"], "e": str(resp["epoch"])}
            if resp.get(ATTEMPT_FIELD) is not None:
                rec["a"] = resp[ATTEMPT_FIELD]  # the acquire's attempt (absent: anonymous)
            value = json.dumps(rec)
            # only where Redis kept none (clear.lua keeps what survived: at least as new)
            field = keys.receipt_field(r.principal, r.idem_key, rt, rid)
            pipe.hsetnx(keys.base.kept, field, value)
            pipe.zadd(keys.base.kept_expiry, {field: r.expires_at_ms}, nx=True)
            n += 1
            if n % 500 == 0:
                pipe.execute()
        pipe.execute()
    return n


def rebuild(auth: AuthorityBase, org: str) -> int:
    """Rebuild the org's Redis lease state from the ledger (see the module docstring).

    Returns:
        The new incarnation number (``int``).

    Raises:
        UnavailableError: another client holds the rebuild lock, or Redis or the ledger
            failed; the marker stays missing, so operations keep failing closed.
    """
    keys = org_keys(org)
    client = auth.client
    token = uuid.uuid4().hex
    lock_keys = [*keys.base, keys.rebuild]
    try:
        if not client.set(keys.rebuild, token, nx=True, px=REBUILD_LOCK_MS):
            raise RebuildInProgress(
                f"the Redis lease state of org {org!r} is being rebuilt from the ledger; retry"
            )
        try:
            if client.exists(keys.base.inc):  # someone finished meanwhile
                auth.scripts["unlock"](keys=[keys.rebuild], args=[token])
                return -1
            auth.reconciler.drain(org)
            bumped = bump_incarnation(auth, org)
            assert bumped is not None  # not decided_only
            n, existed = bumped
            _check(auth.scripts["clear"](keys=lock_keys, args=[token, "pad"]), org)
            batch: list[str] = []
            restored = 0
            for row in _heads(auth, org):
                batch += _restore_args(row)
                if len(batch) >= 2 * RESTORE_BATCH:
                    _check(auth.scripts["restore"](keys=lock_keys, args=[token, *batch]), org)
                    client.pexpire(keys.rebuild, REBUILD_LOCK_MS)
                    restored += len(batch) // 2
                    batch = []
            if batch:
                _check(auth.scripts["restore"](keys=lock_keys, args=[token, *batch]), org)
                restored += len(batch) // 2
            receipts = _restore_receipts(auth, org)
            now = node_time_ms(client, keys.base.inc)  # the clock of the org's node
            floor, ceiling = incarnation_epochs(n)
            delay = 0
            if existed and auth.post_loss == "lock_delay":
                delay = now + auth.lock_delay_ms
            # listed before the marker exists, so that a snapshot holding the marker lists
            # the org too (a restarted server's markers are found there: .restarts)
            client.sadd(ORGS_KEY, org)
            _check(
                auth.scripts["install"](
                    keys=lock_keys,
                    args=[
                        token,
                        uuid.uuid4().hex,
                        n,
                        floor,
                        ceiling,
                        delay,
                        auth.old_retention_ms,
                    ],
                ),
                org,
            )
        except BaseException:
            try:
                auth.scripts["unlock"](keys=[keys.rebuild], args=[token])
            except RedisError:
                pass
            raise
    except RedisError as exc:
        raise UnavailableError(f"Redis unavailable while rebuilding org {org!r}: {exc}") from exc
    if existed:
        log.warning(
            "rebuilt the Redis lease state of org %r from the ledger: incarnation %d, "
            "%d resources, %d receipts, epochs now above %d",
            org,
            n,
            restored,
            receipts,
            incarnation_epochs(n)[0],
        )
    return n


def _check(reply: Any, org: str) -> None:
    if int(reply[0]) != OK:
        code = int(reply[0])
        raise UnavailableError(
            f"rebuild of org {org!r} was interrupted (code {code}"
            f"{', lock lost' if code == REBUILD_LOST else ''}); retry"
        )


def rotate(auth: AuthorityBase, org: str) -> None:
    """Move the org to a new incarnation's epoch range once its range is used up.

    Raises:
        UnavailableError: Redis or the ledger failed (nothing changed in Redis).
    """
    keys = org_keys(org)
    try:
        seen = auth.client.hget(keys.base.inc, "id")
        if seen is None:
            return  # lost meanwhile: the next call rebuilds
        bumped = bump_incarnation(auth, org, decided_only=True)
        if bumped is None:
            return  # handed back to the ledger meanwhile: its Redis state is cleared
        n = bumped[0]
        auth.scripts["rotate"](keys=list(keys.base), args=[seen, n, *incarnation_epochs(n)])
    except RedisError as exc:
        raise UnavailableError(f"Redis unavailable while rotating org {org!r}: {exc}") from exc
    log.info("org %r moved to incarnation %d (epoch range used up)", org, n)
