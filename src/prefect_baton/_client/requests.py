"""What an idempotency receipt of a keyed client operation binds: its scope and request fields.

A keyed ``renew``, ``transfer``, ``release``, ``release_by_id``, ``force_release`` or handoff
``resolve`` hands the store an :class:`~prefect_baton._stores.protocol.Idempotency` (key,
scope, fields); the store digests the fields with
:func:`prefect_baton._rules.digests.operation_digest` and keeps the receipt per scope. Each
operation's fields are built by the one function of that operation here, from the validated
arguments (and the arguments as the caller gave them where noted), so that an exact retry
gives the same digest. No I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prefect_baton._rules.core import Proof
from prefect_baton._rules.digests import resource_key
from prefect_baton._stores.protocol import Idempotency
from prefect_baton.models import Lease

__all__ = [
    "force_release_fields",
    "keyed",
    "release_by_id_fields",
    "release_fields",
    "renew_fields",
    "resolve_fields",
    "resource_scope",
    "transfer_fields",
]


def keyed(
    key: str | None, build: Callable[[], tuple[str, Mapping[str, object]]]
) -> Idempotency | None:
    """The :class:`Idempotency` of a call under ``key`` (``None`` without a key).

    Args:
        key: the validated idempotency key, or ``None``.
        build: returns the receipt's scope (what the receipt is kept per besides (org,
            principal, operation, key): a resource (:func:`resource_scope`),
            ``handoff:<id>``, or ``""``) and the request fields (one of the functions
            below). Called only under a key, so that an unkeyed call builds nothing.
    """
    if key is None:
        return None
    scope, fields = build()
    return Idempotency(key, scope, fields)


def resource_scope(lease: Lease) -> str:
    """The receipt scope of a keyed operation on a lease presented by proof: its resource
    (DESIGN.md: a lease operation's key identity includes the resource)."""
    return resource_key(lease.resource_type, lease.resource_id)


def renew_fields(
    proof: Proof, *, ttl_seconds: int | None, expected_version: int | None
) -> dict[str, object]:
    """Fields of a ``renew`` by ``proof`` (``ttl_seconds``: as the caller gave it, ``None``
    for the lease's own TTL; ``expected_version``: validated)."""
    return {
        "lease_id": proof.lease_id,
        "execution_key": proof.execution_key,
        "ttl_seconds": ttl_seconds,
        "expected_version": expected_version,
    }


def transfer_fields(
    proof: Proof,
    *,
    to_principal: str,
    new_execution_key: str,
    ttl_seconds: int,
    expected_version: int | None,
) -> dict[str, object]:
    """Fields of a ``transfer`` by ``proof`` to ``to_principal`` under ``new_execution_key``
    (validated ids; ``ttl_seconds`` as given, integer seconds)."""
    return {
        "lease_id": proof.lease_id,
        "execution_key": proof.execution_key,
        "to_principal": to_principal,
        "new_execution_key": new_execution_key,
        "ttl_seconds": ttl_seconds,
        "expected_version": expected_version,
    }


def release_fields(proof: Proof, *, expected_version: int | None) -> dict[str, object]:
    """Fields of a ``release`` by ``proof`` (``expected_version``: validated, or ``None``)."""
    return {
        "lease_id": proof.lease_id,
        "execution_key": proof.execution_key,
        "expected_version": expected_version,
    }


def release_by_id_fields(lease_id: str) -> dict[str, object]:
    """Fields of a ``release_by_id`` of ``lease_id`` (validated): the lease id alone."""
    return {"lease_id": lease_id}


def force_release_fields(lease_id: str) -> dict[str, object]:
    """Fields of a ``force_release`` of ``lease_id`` (validated): the lease id alone."""
    return {"lease_id": lease_id}


def resolve_fields(
    handoff_id: str,
    status: str,
    *,
    note: str | None,
    execution_key: str | None,
    ttl_seconds: int | None,
) -> dict[str, object]:
    """Fields of a handoff ``resolve`` (validated ``handoff_id``, ``status``, ``note`` and
    ``execution_key``; ``ttl_seconds`` as given, ``None`` for the sender's TTL)."""
    return {
        "handoff_id": handoff_id,
        "status": status,
        "note": note,
        "execution_key": execution_key,
        "ttl_seconds": ttl_seconds,
    }
