"""The Redis lease authority's plumbing: construction, the script call loop, the drain.

:class:`AuthorityBase` holds what every lease operation of
:class:`~prefect_baton._stores.redis.authority.RedisAuthority` shares: its settings and clients,
:meth:`~AuthorityBase._run` (one script, one round trip; it rebuilds the org's Redis state
from the ledger when it is missing and rotates it when asked, see
:mod:`prefect_baton._stores.redis.rebuild`), the acknowledgement of each transition (``ack=``:
the drain thread, or a drain up to the call's own entry), the read-your-writes barrier
:meth:`~AuthorityBase.sync_ledger`, and :meth:`~AuthorityBase.close`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from prefect_baton._rules import core as _core
from prefect_baton._rules.core import Decision, Generation
from prefect_baton._stores.ledger.store import LedgerStore, row_to_generation
from prefect_baton._stores.protocol import Caller
from prefect_baton._stores.redis.cluster import RedisClient
from prefect_baton._stores.redis.connection import (
    as_text,
    direct_pool,
    evalsha,
    is_config_error,
    redis_error,
)
from prefect_baton._stores.redis.keys import ORGS_KEY, org_keys
from prefect_baton._stores.redis.rebuild import recover, rotate
from prefect_baton._stores.redis.reconciler import DEFAULT_BATCH, Drainer, Reconciler
from prefect_baton._stores.redis.restarts import watch_restarts
from prefect_baton._stores.redis.scripts import NO_INCARNATION, ROTATE, Scripts
from prefect_baton.errors import BatonError, NotFoundError, UnavailableError, ValidationError

if TYPE_CHECKING:
    from prefect_baton._settings import BatonSettings

__all__ = ["ACK_MODES", "POST_LOSS_POLICIES", "AckMode", "AuthorityBase", "PostLossPolicy"]

log = logging.getLogger("prefect_baton.redis")

AckMode = Literal["redis", "ledger"]
PostLossPolicy = Literal["fence_only", "lock_delay"]
ACK_MODES = ("redis", "ledger")
DEFAULT_MAX_LAG_ENTRIES = 10_000
"""Default limit of an org's unapplied journal entries before acquires help drain it."""
LAG_CHECK_SECONDS = 0.1
"""How often (seconds, per org and client) an acquire reads the journal's length."""
POST_LOSS_POLICIES = ("fence_only", "lock_delay")


def eviction_policy(client: RedisClient, refusals: list[str] | None = None) -> str | None:
    """The server's ``maxmemory-policy`` (``CONFIG GET``, else ``INFO memory``; on a
    cluster, the first node's that answers), or ``None`` when the server does not say (both
    commands refused, as some managed services and fakeredis do; the error replies are
    appended to ``refusals`` when given).

    Raises:
        ValidationError: the connection is configured wrong (a database index the server
            does not have, a wrong password: :func:`~.connection.is_config_error`).
        redis.exceptions.ConnectionError, TimeoutError: the server cannot be reached.
    """
    refusals = [] if refusals is None else refusals
    reads: list[Callable[[], Any]] = [
        lambda: client.config_get("maxmemory-policy"),
        lambda: client.info("memory"),
    ]
    for read in reads:
        try:
            answer = read()
        except RedisError as exc:
            if is_config_error(exc, command=False):
                raise redis_error(exc) from exc
            if isinstance(exc, RedisConnectionError | RedisTimeoutError):
                raise
            refusals.append(str(exc))
            continue
        for found in [answer, *(v for v in answer.values() if isinstance(v, dict))]:
            policy = found.get("maxmemory-policy") or found.get("maxmemory_policy")
            if policy:
                return as_text(policy)
    return None


def check_eviction_policy(client: RedisClient, *, allow: bool) -> None:
    """Refuse a Redis that may evict the authority's keys: its ``maxmemory-policy`` must be
    ``noeviction`` (the default). An ``allkeys-*`` policy evicts keys without a TTL (an
    org's lease state: every eviction then makes the org fail closed and rebuild from the
    ledger), a ``volatile-*`` one the keys with a TTL (acquire receipts, handoff
    resolutions) before their time. A policy the server does not disclose is logged, not
    refused.

    Args:
        client: the authority's Redis client.
        allow: accept any policy (``allow_eviction``, ``BATON_REDIS_ALLOW_EVICTION``).

    Raises:
        ValidationError: the policy is not ``noeviction`` and ``allow`` is false; the
            connection is configured wrong (database index, password).
        redis.exceptions.ConnectionError, TimeoutError: the server cannot be reached.
    """
    if allow:
        return
    refusals: list[str] = []
    policy = eviction_policy(client, refusals)
    if policy is None:
        log.warning(
            "could not read Redis maxmemory-policy (%s); the lease authority needs "
            "noeviction, so check it on the server",
            "; ".join(refusals) or "the server does not report it",
        )
    elif policy != "noeviction":
        raise ValidationError(
            f"Redis maxmemory-policy is {policy!r}: the lease authority needs 'noeviction' "
            "(an evicted key would make the org's leases fail closed until they are rebuilt "
            "from the ledger). Set maxmemory-policy noeviction, or accept evictions with "
            "allow_eviction=True (BATON_REDIS_ALLOW_EVICTION=1)"
        )


def check_options(
    ack: str, post_loss: str, max_lag_entries: Any, *, names: Mapping[str, str] | None = None
) -> None:
    """Validate the options of :class:`~prefect_baton._stores.redis.authority.RedisAuthority` that
    come from settings, so that a caller can refuse them before opening a ledger.

    Args:
        names: what to call an option in the message (``str`` by option name), e.g.
            ``{"ack": "BATON_REDIS_ACK"}`` for a value read from that variable; the message
            then starts ``bad setting: ``. Options not named keep their own name.

    Raises:
        ValidationError: an unknown ``ack`` or ``post_loss``, or a ``max_lag_entries`` that
            is not an integer of 0 or more.
    """

    def refuse(option: str, rule: str) -> ValidationError:
        name = (names or {}).get(option)
        return ValidationError(f"bad setting: {name} {rule}" if name else f"{option} {rule}")

    if ack not in ACK_MODES:
        raise refuse("ack", f"must be 'redis' or 'ledger', got {ack!r}")
    if post_loss not in POST_LOSS_POLICIES:
        raise refuse("post_loss", f"must be 'fence_only' or 'lock_delay', got {post_loss!r}")
    if isinstance(max_lag_entries, bool) or not isinstance(max_lag_entries, int):
        raise refuse("max_lag_entries", f"must be an integer, got {max_lag_entries!r}")
    if max_lag_entries < 0:
        raise refuse("max_lag_entries", f"must be 0 or more, got {max_lag_entries}")


def options_from(settings: BatonSettings, *, ack: str | None = None) -> dict[str, Any]:
    """The :class:`~prefect_baton._stores.redis.authority.RedisAuthority` keyword arguments that the
    ``BATON_REDIS_*`` settings give (``ack`` overrides ``BATON_REDIS_ACK``), checked by
    :func:`check_options`, so a caller can refuse them before it opens a ledger.

    Raises:
        ValidationError: as :func:`check_options`.
    """
    opts: dict[str, Any] = {
        "ack": ack or settings.redis_ack,
        "post_loss": settings.redis_post_loss,
        "max_lag_entries": settings.redis_max_lag_entries,
    }
    names = {"post_loss": "BATON_REDIS_POST_LOSS", "max_lag_entries": "BATON_REDIS_MAX_LAG_ENTRIES"}
    if ack is None:
        names["ack"] = "BATON_REDIS_ACK"
    check_options(**opts, names=names)
    opts["allow_eviction"] = settings.redis_allow_eviction
    return opts


class AuthorityBase:
    """The shared state and plumbing of
    :class:`~prefect_baton._stores.redis.authority.RedisAuthority`
    (arguments and errors: see that class)."""

    def __init__(
        self,
        client: RedisClient,
        store: LedgerStore,
        *,
        ack: str = "redis",
        post_loss: str = "fence_only",
        lock_delay_seconds: int = _core.TTL_MAX_SECONDS,
        auto_rebuild: bool = True,
        rebuild_wait_seconds: float = 10.0,
        reconcile_interval_seconds: float = 0.05,
        reconcile_in_client: bool = True,
        batch_size: int = DEFAULT_BATCH,
        max_lag_entries: int = DEFAULT_MAX_LAG_ENTRIES,
        owns_client: bool = False,
        functions: bool = True,
        allow_eviction: bool = False,
    ) -> None:
        check_options(ack, post_loss, max_lag_entries)
        self.client = client
        self.allow_eviction = allow_eviction
        self._policy_checked = False
        try:
            self._check_policy()
        except ValidationError:
            if owns_client:
                client.close()
            raise
        self.store = store
        self.ack = ack
        self.post_loss = post_loss
        self.lock_delay_ms = int(lock_delay_seconds) * 1000
        self.auto_rebuild = auto_rebuild
        self.rebuild_wait_seconds = rebuild_wait_seconds
        self.receipt_ttl_ms = store.receipt_retention_ms
        self._receipt_ttl = str(self.receipt_ttl_ms)
        self.old_retention_ms = max(store.receipt_retention_ms, 3_600_000)
        # a new server process (restart, failover) counts as a data loss: .restarts
        watch_restarts(client)
        self.scripts = Scripts(client, functions=functions)
        # The direct call path (FCALL or EVALSHA, see _evalsha) applies to a plain
        # redis.Redis client only.
        self._pool = direct_pool(client)
        self.reconciler = Reconciler(client, store, batch_size=batch_size)
        self._interval = reconcile_interval_seconds
        self._drain_here = reconcile_in_client
        self._drainer: Drainer | None = None
        self._drainer_pid = 0
        self._lock = threading.Lock()
        self._owns_client = owns_client
        self._known: set[str] = set()
        self.max_lag_entries = max_lag_entries
        # org -> when its journal length is read next (monotonic seconds); orgs found over
        # the limit are in _lag_over until a read finds them under it again
        self._lag_due: dict[str, float] = {}
        self._lag_over: set[str] = set()
        # (org, resource type, resource id) -> until when (monotonic seconds) a refused
        # acquire does not ask the ledger for expired handoffs carrying its lease again
        self._carrier_quiet: dict[tuple[str, str, str], float] = {}
        #: (org, lease id) -> (monotonic time until which it holds, the pending handoffs
        #: carrying the lease as ``(handoff id, deadline ms)``): see ``handoffs.lease_carriers``
        self._carriers_seen: dict[tuple[str, str], tuple[float, list[tuple[str, int]]]] = {}

    # ------------------------------------------------------------------ plumbing

    def _check_policy(self) -> None:
        """:func:`check_eviction_policy`, once: at construction, or at the first operation
        when the server could not be reached then."""
        try:
            check_eviction_policy(self.client, allow=self.allow_eviction)
        except (RedisConnectionError, RedisTimeoutError):
            return
        self._policy_checked = True

    def _run(
        self,
        org: str,
        name: str,
        args: Sequence[Any],
        extra_keys: Sequence[str] = (),
        *,
        rebuild: bool = True,
    ) -> list[Any]:
        if not self._policy_checked:
            self._check_policy()
        keys = [*org_keys(org).base, *extra_keys]
        for _attempt in range(4):
            try:
                reply: list[Any] = self._evalsha(name, keys, args)
            except RedisError as exc:
                raise redis_error(exc) from exc
            code = int(reply[0])
            if code == NO_INCARNATION:
                self._known.discard(org)
                if not rebuild:
                    raise UnavailableError(
                        f"the Redis lease state of org {org!r} is missing; it is rebuilt "
                        "from the ledger by the next lease operation"
                    )
                recover(self, org)
                continue
            if code == ROTATE:
                rotate(self, org)
                continue
            if org not in self._known:
                self._register(org)
            return reply
        raise UnavailableError(f"the Redis lease state of org {org!r} did not settle; retry")

    def _evalsha(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        """Run operation ``name`` once (see :func:`.connection.evalsha`)."""
        return evalsha(self.scripts, self._pool, name, keys, args)

    def _register(self, org: str) -> None:
        try:
            self.client.sadd(ORGS_KEY, org)
            self._known.add(org)
        except RedisError as exc:
            log.info("could not register org %r for reconcilers: %s", org, exc)

    def _backpressure(self, org: str) -> None:
        """Before an acquire with ``ack="redis"``: at most every :data:`LAG_CHECK_SECONDS`
        per org, read the journal's length (one ``XLEN``; none within
        :data:`LAG_CHECK_SECONDS` of a read by which a drain of this client applied the
        journal to its end, such as its drain thread's rounds) and, while more than
        ``max_lag_entries`` entries are not in the ledger, drain a batch in this call
        (waiting for the journal lock while another client or ``baton reconcile``
        drains). Producers are slowed to the rate the ledger takes, so the lag, the
        journal's memory in Redis and what a Redis data loss could take away stay bounded.

        Raises:
            UnavailableError: the ledger could not be written while over the limit; the
                acquire did not run (nothing was granted), a retry is safe.
        """
        limit = self.max_lag_entries
        if not limit or self.ack != "redis":
            return
        now = time.monotonic()
        due = self._lag_due.get(org, 0.0)
        caught_up = self.reconciler.caught_up_at.get(org)
        if caught_up is not None:
            # a drain of this client applied everything pending then: as good as an XLEN
            due = max(due, caught_up + LAG_CHECK_SECONDS)
        if now < due and org not in self._lag_over:
            return
        self._lag_due[org] = now + LAG_CHECK_SECONDS
        journal = org_keys(org).base.journal
        try:
            pending = int(self.client.xlen(journal))
            while pending > limit:
                # every acquire of this client waits and helps until a read finds the
                # journal under the limit (not only the one whose turn it was to read)
                self._lag_over.add(org)
                try:
                    applied = self.reconciler.drain(org, max_batches=1)
                except UnavailableError as exc:
                    raise UnavailableError(
                        f"{pending} journal entries wait for the ledger (limit {limit}: "
                        "max_lag_entries, BATON_REDIS_MAX_LAG_ENTRIES) and draining them "
                        f"failed, so no lease is granted until the ledger catches up: {exc}"
                    ) from exc
                pending = int(self.client.xlen(journal))
                if not applied:
                    break
        except RedisError:
            return  # the operation itself reports Redis being unreachable
        self._lag_over.discard(org)

    def _acked(self, org: str, entry_id: Any) -> None:
        """Acknowledge journal entry ``entry_id`` of ``org`` as ``ack=`` says: with
        ``ack="ledger"`` drain the journal up to it now (if the ledger cannot take it, the
        drain thread keeps trying in the background until it has caught up, and the call
        raises); with ``ack="redis"`` hand the org to the drain thread.

        Raises:
            UnavailableError: with ``ack="ledger"``, the ledger could not be written, or it
                refused the entry (a journal fault, see
                :mod:`~prefect_baton._stores.redis.reconciler`: the org's Redis state is
                rebuilt and the transition does not count).
        """
        if self.ack == "ledger":
            eid = as_text(entry_id)
            try:
                self.reconciler.drain(org, until=eid)
            except UnavailableError:
                if self._drain_here:
                    self._drain_thread().add(org, until_caught_up=True)
                raise
            if eid in self.reconciler.refused:
                raise UnavailableError(
                    f"the ledger refused this transition of org {org!r} (journal entry {eid}, "
                    "recorded as a fault); the org's Redis state is rebuilt from the ledger: "
                    "retry"
                )
            return
        if self._drain_here:
            self._drain_thread().add(org)

    def _drain_thread(self) -> Drainer:
        """This process's drain thread, started on first use."""
        drainer = self._drainer
        if drainer is None or not drainer.alive() or self._drainer_pid != os.getpid():
            with self._lock:
                drainer = self._drainer
                if drainer is None or not drainer.alive() or self._drainer_pid != os.getpid():
                    drainer = Drainer(self.reconciler, interval_seconds=self._interval)
                    self._drainer = drainer
                    self._drainer_pid = os.getpid()
        return drainer

    @contextmanager
    def drain_paused(self) -> Iterator[None]:
        """Hold this process's drain thread between drains for the block (see
        :meth:`Drainer.paused <prefect_baton._stores.redis.reconciler.Drainer.paused>`): enter
        it before the process is stopped, so that no ledger transaction of the drain is left
        open while it is. A no-op when the thread has not started."""
        drainer = self._drainer
        if drainer is None or self._drainer_pid != os.getpid():
            yield
            return
        with drainer.paused():
            yield

    @property
    def receipt_ledger(self) -> LedgerStore:
        """The ledger keeping the idempotency receipts of this authority's operations."""
        return self.store

    def sync_ledger(self, org: str, *, strict: bool = False) -> None:
        """Drain the org's journal up to its newest entry, so the ledger shows every
        transition made so far (a read-your-writes barrier for ledger operations).

        Args:
            strict: raise :class:`UnavailableError` when Redis cannot be reached (default:
                log and return, leaving the ledger as it is).
        """
        journal = org_keys(org).base.journal
        try:
            last = self.client.xrevrange(journal, count=1)
        except RedisError as exc:
            if strict:
                raise redis_error(exc) from exc
            log.debug("ledger barrier skipped for %r: %s", org, exc)
            return
        if last:
            self.reconciler.drain(org, until=as_text(last[0][0]))

    def ensure_ready(self, org: str) -> None:
        """Make sure the org's Redis state exists (rebuilding it if it is missing) before a
        ledger transaction that will consult Redis (a fenced write); a no-op once this
        authority has seen the org."""
        if org not in self._known:
            self._run(org, "inspect", ["-"])

    def rebuild(self, org: str) -> int:
        """Rebuild the org's Redis state from the ledger now (see
        :func:`prefect_baton._stores.redis.rebuild.rebuild`); returns the incarnation number."""
        from prefect_baton._stores.redis.rebuild import rebuild

        return rebuild(self, org)

    def return_to_ledger(self, org: str, *, force: bool = False) -> bool:
        """Hand ``org``'s leases back to the ledger (see
        :func:`prefect_baton._stores.redis.rebuild.return_to_ledger`, which also says what
        ``force`` allows and the errors raised); whether Redis decided them until now."""
        from prefect_baton._stores.redis.rebuild import return_to_ledger

        return return_to_ledger(self, org, force=force)

    def close(self) -> None:
        """Stop the drain thread after a last drain of the orgs it served, and close the
        client when this authority owns it."""
        drainer, self._drainer = self._drainer, None
        if drainer is not None and self._drainer_pid == os.getpid():
            drainer.stop()
            for org in drainer.orgs:
                try:
                    self.reconciler.drain(org)
                except BatonError as exc:
                    log.warning("final reconcile of %r failed: %s", org, exc)
        if self._pool is not None:
            self._pool.close()
        if self._owns_client:
            self.client.close()

    def _unknown(
        self, caller: Caller, lease_id: str, decide: Callable[[Generation | None, int], Decision]
    ) -> Decision:
        """A lease id Redis does not know (never seen, or a generation pruned after the
        retention): the ledger's history decides which error it is. Only a read-only
        outcome (``no_change``) can come back; anything else is not found."""
        self.sync_ledger(caller.org)
        with self.store._read() as (s, now):
            row = self.store._row_by_id(s, caller.org, lease_id)
            held = row_to_generation(row) if row is not None else None
        d = decide(held, now)
        if d.noop:
            return d
        raise NotFoundError(f"lease {lease_id} not found")
