"""The reads of the Redis lease authority: what a principal sees about a resource, a
generation by id, the effective leases, and what a fenced ledger write checks, all judged
on the Redis clock (the ledger's history where Redis keeps none).

:class:`RedisLeaseReads` is a base of
:class:`~prefect_baton._stores.redis.authority.RedisAuthority`, as
:class:`~prefect_baton._stores.ledger.lease_reads.LeaseReads` is of the ledger's lease
operations.
"""

from __future__ import annotations

from prefect_baton._rules.access import check_list_owner, may_read
from prefect_baton._rules.core import Generation
from prefect_baton._rules.paging import store_limit
from prefect_baton._stores.ledger.convert import lease_info
from prefect_baton._stores.ledger.store import generation_to_lease
from prefect_baton._stores.protocol import Caller
from prefect_baton._stores.queries import LeaseQuery
from prefect_baton._stores.redis.base import AuthorityBase
from prefect_baton._stores.redis.codec import from_gen, opt
from prefect_baton._stores.redis.keys import resource_digest
from prefect_baton._stores.redis.scripts import UNKNOWN
from prefect_baton.errors import NotFoundError
from prefect_baton.models import Lease, LeaseInfo

__all__ = ["RedisLeaseReads"]


class RedisLeaseReads(AuthorityBase):
    """The reads of :class:`~prefect_baton._stores.redis.authority.RedisAuthority` (see the
    module docstring)."""

    def inspect(self, caller: Caller, resource_type: str, resource_id: str) -> LeaseInfo:
        """What any principal of the org may see about a resource (the holder also gets its
        lease), judged on the Redis clock."""
        reply = self._run(caller.org, "inspect", [resource_digest(resource_type, resource_id)])
        head = from_gen(reply[2]) if reply[2] else None
        return lease_info(caller, resource_type, resource_id, head, int(reply[1]))

    def generation(
        self, caller: Caller, lease_id: str, *, rebuild: bool = True
    ) -> tuple[Generation | None, int]:
        """The generation ``lease_id`` as Redis has it (``None`` when unknown to Redis) and
        the Redis clock in epoch ms. With ``rebuild=False`` a missing incarnation marker
        raises :class:`UnavailableError` instead of starting a rebuild."""
        reply = self._run(caller.org, "get", [lease_id], rebuild=rebuild)
        if int(reply[0]) == UNKNOWN:
            return None, int(reply[1])
        return from_gen(reply[2]), int(reply[1])

    def get(self, caller: Caller, lease_id: str) -> Lease:
        """A generation by id, for its owner (any of the org's for owner/admin).

        Raises:
            NotFoundError: unknown, another org's, or another principal's lease.
        """
        h, _now = self.generation(caller, lease_id)
        if h is None:
            self.sync_ledger(caller.org)
            return self.store.ledger_get(caller, lease_id)
        if not may_read(caller.role, caller.principal, (h.owner,)):
            raise NotFoundError(f"lease {lease_id} not found")
        return generation_to_lease(h)

    def list_leases(self, caller: Caller, query: LeaseQuery) -> list[Lease]:
        """Effective leases of the caller (``owner``: a name or ``"*"``, needs owner/admin),
        newest first (``query.after``: continuing after this ``(acquired_at ms,
        lease_id)``); with ``include_ended`` the ledger's history (after a drain)."""
        who = caller.principal if query.owner is None else query.owner
        check_list_owner(caller.role, caller.principal, who)
        if query.include_ended:
            self.sync_ledger(caller.org)
            return self.store.ledger_list_leases(caller, query)
        reply = self._run(caller.org, "list", ["" if who == "*" else who, opt(query.resource_type)])
        gens = [from_gen(raw) for raw in reply[2:]]
        if query.after is not None:
            after = query.after
            gens = [h for h in gens if (h.acquired_at_ms, h.lease_id) < after]
        gens.sort(key=lambda h: (h.acquired_at_ms, h.lease_id), reverse=True)
        return [generation_to_lease(h) for h in gens[: store_limit("leases", query.limit)]]

    def fence_check(
        self, caller: Caller, lease_id: str, resource: tuple[str, str] | None
    ) -> tuple[Generation | None, int]:
        """What a fenced ledger write checks, read from Redis: the generation ``lease_id``
        (``None`` if unknown, or if it is not of ``resource``) and the Redis clock.

        The ledger write calls this inside its transaction, holding the resource's lock,
        so fenced writes of one resource are checked and committed one at a time: once a
        newer generation has written, an older one's check can only fail. It never starts a
        rebuild (that needs the ledger, whose write lock the caller holds): if Redis lost
        its data the write fails closed with ``UNAVAILABLE``.
        """
        h, now = self.generation(caller, lease_id, rebuild=False)
        if h is not None and resource is not None and (h.resource_type, h.resource_id) != resource:
            h = None
        return h, now
