"""The Redis lease authority: every lease operation is one Lua script, one round trip.

:class:`RedisAuthority` implements :class:`prefect_baton._stores.protocol.LeaseAuthority` with the
rules of :mod:`prefect_baton._rules.core` mirrored in ``scripts/*.lua`` (expiry on Redis ``TIME``,
never the client's clock), keeps acquire receipts in Redis with the ledger's identity and
digest, checks write scopes through an index of literal scope prefixes (so the cost does not
grow with unrelated leases), and appends each transition to the org's journal stream, which
the :mod:`reconciler <prefect_baton._stores.redis.reconciler>` drains into the ledger.

Acknowledgement (``ack=``):

* ``"redis"`` (default): a call returns once Redis has the transition; a daemon thread of the
  client drains the journal into the ledger (lag: milliseconds under normal load). Ledger
  operations of the same client drain the journal first, so they see the client's own
  transitions (read-your-writes). See :mod:`prefect_baton._stores.redis.rebuild` for what this mode
  can lose when Redis loses its data, and what it cannot.
* ``"ledger"``: a call returns after the ledger has committed the transition (the call
  drains the journal up to its own entry).

A connection error or timeout raises :class:`UnavailableError`: the operation may or may not
have been applied; retry it with the same idempotency key (a retried release is
``no_change``, a retried keyed acquire replays). The client made by :func:`connect` never
retries a script on its own, so a script runs at most once per call.

This module holds the lease operations; the reads are in
:mod:`prefect_baton._stores.redis.reads`, the shared state, the script call loop and the
drain in :mod:`prefect_baton._stores.redis.base`, the connection and error plumbing in
:mod:`prefect_baton._stores.redis.connection` (:func:`connect` is importable from both).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from prefect_baton._ids import random_hex, random_uuid4_hex
from prefect_baton._rules import transitions as _transitions
from prefect_baton._rules.core import (
    Decision,
    Generation,
    Proof,
    ReleaseRequest,
    RenewRequest,
    TransferRequest,
)
from prefect_baton._rules.digests import acquire_request_digest
from prefect_baton._stores.ledger.receipted_ops import ReceiptedLeaseOps
from prefect_baton._stores.ledger.store import LedgerStore, generation_to_lease
from prefect_baton._stores.protocol import (
    MAX_MANY,
    AcquireRequest,
    Caller,
    Execution,
    Fence,
    ResolveRequest,
)
from prefect_baton._stores.redis.codec import (
    construct,
    is_plain,
    lease_from_gen,
    opt,
    plain_args,
    plain_leases,
    scope_meta,
)
from prefect_baton._stores.redis.connection import as_text, connect
from prefect_baton._stores.redis.handoffs import (
    end_carriers,
    expire_handoff,
    resolve_handoff,
    run_carried,
)
from prefect_baton._stores.redis.keys import HANDOFF_KEY_TTL_MS, OrgKeys, resource_digest
from prefect_baton._stores.redis.reads import RedisLeaseReads
from prefect_baton._stores.redis.scripts import NOOP, OK, REPLAY, UNKNOWN, raise_for
from prefect_baton.errors import (
    BatonError,
    ConflictError,
    ValidationError,
)
from prefect_baton.models import (
    EndStatus,
    Handoff,
    Lease,
    Receipt,
    ReceiptStatus,
)

__all__ = ["RedisAuthority", "connect"]


CARRIER_RECHECK_SECONDS = 0.5
"""How long a refused acquire on Redis trusts the ledger's last answer that no expired
pending handoff carries a lease on the resource (below the shortest handoff expiry, 1 s)."""


class RedisAuthority(RedisLeaseReads, ReceiptedLeaseOps):
    """Leases on Redis, reconciled into the ledger.

    Args:
        client: a ``redis.Redis`` or ``redis.cluster.RedisCluster`` client (see
            :func:`connect`; a client with automatic retries may run a script twice after
            a timeout).
        store: the ledger the journal is drained into.
        ack: ``"redis"`` (default) or ``"ledger"``, see the module docstring.
        post_loss: ``"fence_only"`` (default) or ``"lock_delay"``: the grant policy after
            Redis lost its data (see :mod:`prefect_baton._stores.redis.rebuild`).
        lock_delay_seconds: with ``lock_delay``, how long after a loss no new grant is
            made (``int`` seconds, default 86,400: the largest legal TTL).
        auto_rebuild: rebuild from the ledger when the incarnation marker is missing
            (default ``True``); with ``False`` operations fail with ``UNAVAILABLE`` until
            :meth:`rebuild` is called.
        rebuild_wait_seconds: how long an operation waits for another client's rebuild
            before failing with ``UNAVAILABLE`` (``float`` seconds, default 10).
        reconcile_interval_seconds: pause of the ``ack="redis"`` drain thread when the
            journal is empty (``float``, default 0.05 s).
        reconcile_in_client: with ``ack="redis"``, drain on a thread of this client
            (default ``True``); ``False`` when a ``baton reconcile --follow`` service drains
            (the client then spends no CPU on ledger writes).
        batch_size: journal entries per ledger transaction (default 2,000).
        max_lag_entries: with ``ack="redis"``, the most journal entries of an org that may
            wait for the ledger (``int``, default 10,000; ``0``: no limit). Over it, an
            ``acquire``/``acquire_many`` first drains the journal itself (so producers slow
            to the rate the ledger takes); if the ledger cannot be written it raises
            ``UNAVAILABLE`` before granting anything. Renew, release and transfer are
            never held back. The length is read at most every 0.1 s per org, so the
            journal can pass the limit by what the clients add in that time.
        owns_client: close ``client`` in :meth:`close`.
        functions: run the operations through the Redis function library where the server
            has functions (Redis 7+; default ``True``; see
            :mod:`prefect_baton._stores.redis.scripts`); ``False`` always runs them as scripts
            (``EVALSHA``). A cluster client always runs scripts.
        allow_eviction: accept a server whose ``maxmemory-policy`` is not ``noeviction``
            (default ``False``; see :func:`prefect_baton._stores.redis.base.check_eviction_policy`;
            read at construction, or at the first operation if the server was down then).

    Raises:
        ValidationError: an unknown ``ack`` or ``post_loss`` value, a negative or
            non-integer ``max_lag_entries``; a ``maxmemory-policy`` other than
            ``noeviction`` without ``allow_eviction``.
    """

    @classmethod
    def from_url(cls, url: str, store: LedgerStore, **kwargs: Any) -> RedisAuthority:
        """Connect to ``url`` with :func:`connect` and build an authority owning the client
        (keyword arguments as the constructor's)."""
        return cls(connect(url), store, owns_client=True, **kwargs)

    def bound_caller(self) -> Caller | None:
        """``None``: the authority acts as the caller it is given."""
        return None

    # ------------------------------------------------------------------ acquire

    def _item(
        self, caller: Caller, req: AcquireRequest, key: str | None, lease_id: str | None = None
    ) -> list[str]:
        """The twelve script arguments of one acquire request (``read_item`` in
        ``_acquire.lua``); the last is the field of the org's ``rc`` hash holding its
        receipt (``""`` without an execution key)."""
        rt, rid = req.resource_type, req.resource_id
        digest = ""
        if key is not None:
            digest = acquire_request_digest(req)
        scopes_json = meta = ""
        if req.scopes:
            scopes_json = json.dumps(list(req.scopes), ensure_ascii=False)
            meta = scope_meta(rt, rid, req.scopes)
        return [
            resource_digest(rt, rid),
            rt,
            rid,
            str(req.ttl_ms),
            opt(req.purpose),
            opt(req.expected_version),
            lease_id or f"lease_{random_hex(16)}",
            digest,
            scopes_json,
            meta,
            self._receipt_ttl,
            OrgKeys.receipt_field(caller.principal, key, rt, rid) if key else "",
        ]

    def acquire(self, caller: Caller, request: AcquireRequest, execution: Execution) -> Lease:
        """Acquire or take over a resource in one script (rules:
        :func:`prefect_baton._rules.core.decide_acquire`; receipts as the ledger's, with
        ``execution.attempt``: :func:`prefect_baton._rules.core.replay_check`). Refused
        by a lease that an expired pending handoff carries, it ends that handoff (releasing
        the lease, :func:`expire_handoff`) and tries once more.

        Raises:
            ConflictError, VersionConflictError, IdempotencyMismatchError, LeaseLostError
            (a replay whose lease was lost), IdempotencyInFlightError (another attempt of
            the execution holds it), ValidationError (counters exhausted),
            UnavailableError (Redis unreachable or rebuilding; or the ledger unreachable
            while more than ``max_lag_entries`` journal entries wait for it: nothing was
            granted).
        """
        try:
            return self._acquire(caller, request, execution)
        except ConflictError:
            if not self._end_expired_handoffs(caller, [request]):
                raise
        return self._acquire(caller, request, execution)

    def _end_expired_handoffs(self, caller: Caller, requests: Sequence[AcquireRequest]) -> bool:
        """After a refused acquire: end the expired pending handoffs carrying a lease on a
        resource of ``requests`` (:func:`expire_handoff`); ``True`` if a carried lease was
        released.

        The ledger is asked at most once per :data:`CARRIER_RECHECK_SECONDS` per resource and
        process, and again at the next deadline of a carrying handoff it reported, so a
        refused acquire in a polling loop stays a Redis round trip. No deadline is missed:
        a handoff created after the ledger was asked expires at least 1 s later (the
        shortest handoff expiry), after that wait."""
        mono = time.monotonic()
        quiet = self._carrier_quiet
        todo = [
            (r.resource_type, r.resource_id)
            for r in requests
            if quiet.get((caller.org, r.resource_type, r.resource_id), 0.0) <= mono
        ]
        if not todo:
            return False
        now, rows = self.store.handoff_carriers(caller, todo)
        if len(quiet) > 10_000:
            quiet.clear()
        for rt, rid in todo:
            waits = [(x - now) / 1000 for _h, x, t, i in rows if (t, i) == (rt, rid) and x > now]
            quiet[(caller.org, rt, rid)] = mono + min([CARRIER_RECHECK_SECONDS, *waits])
        ended = [expire_handoff(self, caller, h) for h, x, _t, _i in rows if x <= now]
        return any(lease is not None for lease in ended)

    def expire_handoffs(
        self, caller: Caller, *, handoff_id: str | None = None, limit: int = 1000
    ) -> list[Lease]:
        """End expired pending handoffs of the org (``handoff_id``: that one if it expired;
        else the oldest ``limit`` the ledger finds), releasing their carried leases on Redis
        (:func:`expire_handoff`). Returns the leases released."""
        self.sync_ledger(caller.org)
        if handoff_id is not None:
            ids = [handoff_id]
        else:
            ids = [h for h, _lease in self.store.expired_handoffs(caller, limit=limit)]
        ended = [expire_handoff(self, caller, h) for h in ids]
        return [lease for lease in ended if lease is not None]

    def report_expired(self, caller: Caller, *, limit: int = 1000) -> list[Lease]:
        """Record ``lease.expired`` for the org's leases that Redis finds past their TTL and
        untouched since (at most ``limit``, 1..10,000, oldest expiry first), on the ledger.

        The journal is drained first (so the ledger's copy proposes the right candidates),
        and each candidate is confirmed in Redis inside the ledger's write transaction (the
        generation Redis has, on the Redis clock: :meth:`fence_check`), so a renewal or
        takeover Redis applied is never reported as an expiry.

        Raises:
            UnavailableError: Redis or the ledger cannot be reached, or the org's Redis state
                is missing (rebuilt by the next lease operation).
        """
        self.sync_ledger(caller.org, strict=True)
        return self.store.report_expired(
            caller, limit=limit, check=lambda lease_id: self.fence_check(caller, lease_id, None)
        )

    def _applied(self, org: str, reply: Sequence[Any]) -> Lease:
        """The lease of a script's ``OK`` reply (``[OK, journal entry id, generation,
        ...]``), once the journal entry of ``org`` is acknowledged (:meth:`_acked`).

        Raises:
            UnavailableError: as :meth:`_acked`.
        """
        lease = lease_from_gen(reply[2])
        self._acked(org, reply[1])
        return lease

    def _acquire(self, caller: Caller, request: AcquireRequest, execution: Execution) -> Lease:
        self._backpressure(caller.org)
        args = self._item(caller, request, execution.key)
        reply = self._run(
            caller.org,
            "acquire",
            [caller.principal, caller.role, opt(execution.key), *args, opt(execution.attempt)],
        )
        code = int(reply[0])
        if code == OK:
            return self._applied(caller.org, reply)
        if code in (NOOP, REPLAY):
            return lease_from_gen(reply[1], replayed=True)
        raise_for(reply)
        raise AssertionError("unreachable")

    def acquire_many(
        self, caller: Caller, requests: Sequence[AcquireRequest], execution: Execution
    ) -> list[Lease]:
        """Acquire every resource of ``requests`` or none, in one script.

        Each request is decided exactly as :meth:`acquire` decides it (under the same
        ``execution``); if any is refused, nothing is written and that request's error is
        raised. Returns the leases in request order (``replayed`` for those already held by
        this execution or replayed). Refused by a lease an expired pending handoff carries,
        it ends that handoff and tries once more, as :meth:`acquire`.

        Raises:
            ValidationError: more than 1,000 requests, or the error of the first refused
                request (as :meth:`acquire`).
            UnavailableError: as :meth:`acquire`.
        """
        if not 1 <= len(requests) <= MAX_MANY:
            raise ValidationError(f"acquire_many takes 1 to {MAX_MANY} resources")
        try:
            return self._acquire_many(caller, requests, execution)
        except ConflictError:
            if not self._end_expired_handoffs(caller, requests):
                raise
        return self._acquire_many(caller, requests, execution)

    def _acquire_many(
        self, caller: Caller, requests: Sequence[AcquireRequest], execution: Execution
    ) -> list[Lease]:
        self._backpressure(caller.org)
        # One random id for the call, numbered per resource: 32 hex digits as uuid4's.
        base = random_hex(13)
        if is_plain(requests, execution.key):
            args = plain_args(caller.principal, caller.role, requests, base)
            reply = self._run(caller.org, "acquire_plain", args)
            if int(reply[0]) != OK:
                _refuse(reply, requests)
            out = plain_leases(caller.principal, requests, base, reply)
        else:
            args = [caller.principal, caller.role, opt(execution.key), str(len(requests))]
            for i, req in enumerate(requests):
                args += self._item(caller, req, execution.key, f"lease_{base}{i:06x}")
            args.append(opt(execution.attempt))
            reply = self._run(caller.org, "acquire_many", args)
            if int(reply[0]) != OK:
                _refuse(reply, requests)
            subs, gens = reply[2::2], reply[3::2]
            out = [lease_from_gen(g, replayed=sub != OK) for sub, g in zip(subs, gens, strict=True)]
        if as_text(reply[1]):
            self._acked(caller.org, reply[1])
        return out

    # ------------------------------------------------------------------ by proof

    def _by_proof(
        self,
        caller: Caller,
        name: str,
        proof: Proof,
        args: Sequence[str],
        decide: Callable[[Generation | None, int], Decision],
    ) -> Lease:
        """Run script ``name`` (``renew``, ``transfer``) on the lease named by ``proof``
        with its own ``args``; returns the new generation. A lease id Redis does not know is
        judged by ``decide`` on the ledger's history (:meth:`_unknown`)."""
        reply = self._run(caller.org, name, [*_proof_args(caller, proof), *args])
        code = int(reply[0])
        if code == OK:
            return self._applied(caller.org, reply)
        if code == UNKNOWN:
            self._unknown(caller, proof.lease_id, decide)
        raise_for(reply)
        raise AssertionError("unreachable")

    def _renew(self, caller: Caller, request: RenewRequest) -> Lease:
        """Renew by proof (rules: :func:`prefect_baton._rules.transitions.decide_renew`).

        The earliest deadline of the pending handoffs carrying the lease (read from the
        ledger, :func:`~prefect_baton._stores.redis.handoffs.lease_carriers`) goes to
        ``renew.lua``, which refuses past it on the
        Redis clock (``LEASE_LOST``, :func:`prefect_baton._rules.core.
        handoff_deadline_passed`); such a refusal then ends those handoffs as an acquire
        does (:func:`expire_handoff`: the lease released once, reason ``handoff_expired``).
        """
        return self._by_carried_proof(
            caller,
            "renew",
            request.proof,
            [str(request.ttl_ms), opt(request.expected_version)],
            lambda row, now: _transitions.decide_renew(row, request, now_ms=now),
        )

    def _by_carried_proof(
        self,
        caller: Caller,
        op: str,
        proof: Proof,
        args: list[str],
        decide: Callable[[Generation | None, int], Decision],
    ) -> Lease:
        """:meth:`_by_proof` of a renew or transfer script, with the earliest deadline of the
        pending handoffs carrying the lease appended to ``args`` (:func:`run_carried`)."""
        return run_carried(
            self,
            caller,
            proof.lease_id,
            lambda deadline: self._by_proof(caller, op, proof, [*args, opt(deadline)], decide),
        )

    def _transfer(self, caller: Caller, request: TransferRequest) -> Lease:
        """Transfer by proof as ``request`` says (rules:
        :func:`prefect_baton._rules.transitions.decide_transfer`; the new epoch is also above the
        incarnation's floor); refused past the deadline of a handoff carrying the lease, as
        :meth:`_renew`."""
        return self._by_carried_proof(
            caller,
            "transfer",
            request.proof,
            [
                request.to_principal,
                request.new_execution_key,
                str(request.ttl_ms),
                opt(request.expected_version),
                f"lease_{random_uuid4_hex()}",
                caller.principal,
                "",
                "",
                "",
                str(HANDOFF_KEY_TTL_MS),
            ],
            lambda row, now: _transitions.decide_transfer(
                row, request, now_ms=now, new_lease_id="-"
            ),
        )

    def _release(
        self,
        caller: Caller,
        request: ReleaseRequest,
        *,
        by_handoff: tuple[str, str] | None = None,
    ) -> Receipt:
        """Release by proof (rules: :func:`prefect_baton._rules.transitions.decide_release`).

        ``by_handoff``: ``(handoff id, reason)`` when a handoff's end releases the lease it
        carries (:func:`prefect_baton._rules.handoffs.decide_carried_release`): the
        ledger's ``lease.released`` then names them."""
        args = [*_proof_args(caller, request.proof), opt(request.expected_version)]
        if by_handoff is not None:
            args += [opt(by_handoff[0]), opt(by_handoff[1])]
        reply = self._run(caller.org, "release", args)
        code = int(reply[0])
        if code == OK:
            lease = self._applied(caller.org, reply)
            return _receipt("release", _end_status(lease.status), lease)
        if code == NOOP:
            return _receipt("release", "no_change", lease_from_gen(reply[1]))
        if code == UNKNOWN:
            d = self._unknown(
                caller,
                request.proof.lease_id,
                lambda row, now: _transitions.decide_release(row, request, now_ms=now),
            )
            assert d.new is not None
            return Receipt(action="release", status="no_change", lease=generation_to_lease(d.new))
        raise_for(reply)
        raise AssertionError("unreachable")

    def _end_by_id(self, caller: Caller, name: str, lease_id: str) -> Receipt:
        reply = self._run(caller.org, name, [caller.principal, caller.role, lease_id])
        if int(reply[0]) == OK:
            lease = self._applied(caller.org, reply)
            status = "released" if name == "force_release" else _end_status(lease.status)
            return _receipt(name, status, lease)
        raise_for(reply)
        raise AssertionError("unreachable")

    def _release_by_id(self, caller: Caller, lease_id: str) -> Receipt:
        """Release by id, as its owner (rules: :func:`_transitions.decide_release_by_id`)."""
        return self._end_by_id(caller, "release_by_id", lease_id)

    def _force_release(self, caller: Caller, lease_id: str) -> Receipt:
        """Revoke any lease of the org, as ``owner``/``admin`` (the caller's role checked
        first by :meth:`force_release`; :func:`_transitions.decide_force_release`).

        Raises:
            NotFoundError: not active/unknown.
        """
        return self._end_by_id(caller, "force_release", lease_id)

    # ------------------------------------------------------------------ fences, handoffs

    def fence(self, caller: Caller, lease: Lease) -> Fence:
        """The fence of ``lease`` for a fenced ledger write: it names the lease's resource
        (whose ledger lock serialises fenced writes of it), checks the generation on
        Redis inside the write transaction (:meth:`fence_check`), and, refused past the
        deadline of a handoff carrying the lease, ends that handoff as a refused renew
        does (:func:`end_carriers`).

        Raises:
            UnavailableError: Redis cannot be reached or the org's state cannot be rebuilt.
        """
        resource = (lease.resource_type, lease.resource_id)
        lease_id = lease.lease_id
        self.ensure_ready(caller.org)
        return Fence(
            lease_id,
            lease.epoch,
            resource,
            lambda: self.fence_check(caller, lease_id, resource),
            lambda: end_carriers(self, caller, lease_id),
        )

    def ledger_barrier(self, caller: Caller) -> None:
        """Drain the org's journal into the ledger first (:meth:`sync_ledger`), so record
        operations see this client's lease transitions.

        Raises:
            UnavailableError: Redis or the ledger cannot be reached.
        """
        self.sync_ledger(caller.org)

    def _handoff_resolve(self, caller: Caller, resolution: ResolveRequest) -> Handoff:
        """Resolve a handoff across Redis (its lease) and the ledger (the handoff), keeping
        every crash point in an allowed end state
        (:func:`prefect_baton._stores.redis.handoffs.resolve_handoff`).

        Raises:
            NotFoundError, ForbiddenError, LeaseLostError (see the protocol),
            UnavailableError.
        """
        return resolve_handoff(self, caller, resolution)


def _refuse(reply: Sequence[Any], requests: Sequence[AcquireRequest]) -> None:
    """Raise the refusal of an ``acquire_many`` script (``[code, 1-based index, *args]``),
    naming the refused request (:func:`prefect_baton._stores.ledger.many.refused`)."""
    from prefect_baton._stores.ledger.many import refused

    index = int(reply[1]) - 1
    try:
        raise_for([reply[0], *reply[2:]])
    except BatonError as exc:
        raise refused(exc, index, requests[index]) from None
    raise AssertionError("unreachable")


def _proof_args(caller: Caller, proof: Proof) -> list[str]:
    """The first arguments of a script run on a lease by proof: the caller's principal and
    role, the proof's execution key and lease id."""
    return [caller.principal, caller.role, opt(proof.execution_key), proof.lease_id]


def _end_status(status: str) -> EndStatus:
    return "expired" if status == "expired" else "released"


def _receipt(action: str, status: ReceiptStatus, lease: Lease) -> Receipt:
    return construct(
        Receipt, {"action": action, "status": status, "lease": lease, "replayed": False}
    )
