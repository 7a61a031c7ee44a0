"""``_client.leases.proof_by_id``: the one place a lease proof named by id is built (the
CLI's ``--lease-id``/``--execution-key``, the REST routes' ``lease_id`` and key)."""

from __future__ import annotations

import pytest

from prefect_baton._client.leases import proof_by_id
from prefect_baton.errors import LeaseLostError, NotFoundError
from prefect_baton.testing import memory_baton


def test_proof_by_id_presents_the_given_key_or_keeps_the_lease_s_own() -> None:
    """The lease as read, with the key presented (``None`` too); without a key given, its
    own. An unknown id or another principal's lease is NOT_FOUND; a wrong key is refused
    by the authority (LEASE_LOST), never corrected."""
    with memory_baton(org="o", principal="agent-a") as b:
        lease = b.leases.acquire("deploy", "svc", ttl_seconds=60, idempotency_key="run-1")
        assert proof_by_id(b.leases, lease.lease_id, "run-1") == lease
        assert proof_by_id(b.leases, lease.lease_id, None).execution_key is None
        assert proof_by_id(b.leases, lease.lease_id, "x", key_given=False) == lease
        with pytest.raises(NotFoundError):
            proof_by_id(b.leases, "lease_nope", "run-1")
        with pytest.raises(NotFoundError):
            proof_by_id(b.as_principal("agent-b").leases, lease.lease_id, "run-1")
        with pytest.raises(LeaseLostError):
            b.leases.renew(proof_by_id(b.leases, lease.lease_id, "other"))
        assert b.leases.renew(proof_by_id(b.leases, lease.lease_id, "run-1")).version == 2
