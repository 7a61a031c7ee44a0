"""The caller identity and the protocol every lease authority implements.

The ledger (:class:`prefect_baton._stores.ledger.store.LedgerStore`) is the embedded authority; the
Redis fast path implements the same protocol, and one conformance suite holds every
authority to the same results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from prefect_baton._rules.core import Proof
from prefect_baton.models import Lease, LeaseInfo, Receipt


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is acting: ``org`` and ``principal`` (ids) and ``role`` (agent/owner/admin)."""

    org: str
    principal: str
    role: str = "agent"


class LeaseAuthority(Protocol):
    """Applies lease decisions atomically. Times are milliseconds; every method raises the
    :mod:`prefect_baton.errors` of the matching rule in ``_core``."""

    def acquire(
        self,
        caller: Caller,
        resource_type: str,
        resource_id: str,
        *,
        ttl_ms: int,
        scopes: tuple[str, ...],
        purpose: str | None,
        expected_version: int | None,
        idempotency_key: str | None,
    ) -> Lease: ...

    def renew(
        self, caller: Caller, proof: Proof, *, ttl_ms: int, expected_version: int | None
    ) -> Lease: ...

    def transfer(
        self,
        caller: Caller,
        proof: Proof,
        *,
        to_principal: str,
        new_execution_key: str,
        ttl_ms: int,
        expected_version: int | None,
    ) -> Lease: ...

    def release(self, caller: Caller, proof: Proof, *, expected_version: int | None) -> Receipt: ...

    def release_by_id(self, caller: Caller, lease_id: str) -> Receipt: ...

    def force_release(self, caller: Caller, lease_id: str) -> Receipt: ...

    def inspect(self, caller: Caller, resource_type: str, resource_id: str) -> LeaseInfo: ...

    def get(self, caller: Caller, lease_id: str) -> Lease: ...

    def list_leases(
        self,
        caller: Caller,
        *,
        resource_type: str | None = None,
        owner: str | None = None,
        include_ended: bool = False,
        limit: int = 100,
    ) -> list[Lease]: ...
