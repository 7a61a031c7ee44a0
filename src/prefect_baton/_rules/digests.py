"""The request digest of each keyed operation: what an idempotency receipt binds.

A receipt stores the digest of the request that created it; an exact retry (same key,
same digest) replays it, a different request under the same key is refused. Every store
computes a given operation's digest with the one function here, so that the digests agree
across stores: a Redis rebuild restores the ledger's acquire receipts into Redis, and a
replay after it must still match. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect_baton._rules.core import AcquireRequest
from prefect_baton._rules.validation import request_digest
from prefect_baton.errors import IdempotencyMismatchError

__all__ = [
    "acquire_digest",
    "acquire_request_digest",
    "checkpoint_save_digest",
    "handoff_create_digest",
    "mismatch",
    "operation_digest",
    "outcome_record_digest",
    "resource_key",
]


def acquire_digest(
    *,
    ttl_ms: int,
    scopes: tuple[str, ...],
    purpose: str | None,
    expected_version: int | None,
) -> str:
    """Digest of an acquire of one resource (also each item of ``acquire_many``).

    Args:
        ttl_ms: the validated TTL in milliseconds.
        scopes: the normalised write scopes.
        purpose: the purpose text, or ``None``.
        expected_version: the expected version, or ``None``.

    Returns:
        64 hex digits (SHA-256 of the canonical JSON of the request).
    """
    return request_digest(
        "acquire",
        {
            "expected_version": expected_version,
            "ttl_ms": ttl_ms,
            "scopes": list(scopes),
            "purpose": purpose,
        },
    )


def mismatch(operation: str, key: str) -> IdempotencyMismatchError:
    """The error for a request whose digest differs from the receipt stored under its key.

    Args:
        operation: the keyed operation (``str``: ``acquire``, ``release``, ...). An acquire's
            receipt is kept under its execution key, every other one under its idempotency
            key; the message names the one the caller gave.
        key: that key (``str``).

    Returns:
        :class:`IdempotencyMismatchError` (``IDEMPOTENCY_MISMATCH``): nothing was done.
    """
    if operation == "acquire":
        return IdempotencyMismatchError(
            f"execution key {key!r} was used for a different acquire request of this resource "
            "(another TTL, scopes, purpose or expected version): repeat that request "
            "exactly to replay it, or use another execution key"
        )
    return IdempotencyMismatchError(
        f"idempotency key {key!r} was used for a different {operation} request: repeat that "
        "request exactly to replay it, or use another idempotency key"
    )


def acquire_request_digest(request: AcquireRequest) -> str:
    """:func:`acquire_digest` of the acquire ``request`` (an
    :class:`~prefect_baton._rules.core.AcquireRequest`): the fields its receipt binds."""
    return acquire_digest(
        ttl_ms=request.ttl_ms,
        scopes=request.scopes,
        purpose=request.purpose,
        expected_version=request.expected_version,
    )


def checkpoint_save_digest(
    *,
    state_hash: str,
    expected_version: int | None,
    fence: tuple[str, int] | None,
    ttl_ms: int | None,
) -> str:
    """Digest of a checkpoint save.

    Args:
        state_hash: ``"sha256:"`` + hex digest of the state's canonical JSON.
        expected_version: the compare-and-swap version, or ``None``.
        fence: ``(lease_id, epoch)`` of the fencing lease, or ``None``.
        ttl_ms: the checkpoint's lifetime in milliseconds, or ``None``.
    """
    return request_digest(
        "checkpoint.save",
        {
            "state_hash": state_hash,
            "expected_version": expected_version,
            "fence": list(fence) if fence else None,
            "ttl_ms": ttl_ms,
        },
    )


def handoff_create_digest(
    *,
    to_principal: str,
    subject_id: str,
    checkpoint_id: str | None,
    context_id: str | None,
    message: str | None,
    lease_id: str | None,
    expires_in_ms: int | None,
    parameters: dict[str, Any] | None = None,
) -> str:
    """Digest of a handoff creation (``lease_id``: the carried lease, or ``None``;
    ``expires_in_ms``: the handoff's lifetime in milliseconds, or ``None``;
    ``parameters``: the recipient run's parameters, part of the digest only when given, so
    receipts of handoffs created without them keep their digest)."""
    optional: dict[str, Any] = {} if parameters is None else {"parameters": parameters}
    return request_digest(
        "handoff.create",
        {
            "to": to_principal,
            "subject": subject_id,
            "checkpoint_id": checkpoint_id,
            "context_id": context_id,
            "message": message,
            "lease_id": lease_id,
            "expires_in_ms": expires_in_ms,
            **optional,
        },
    )


def outcome_record_digest(
    *,
    status: str,
    evidence: list[dict[str, object]],
    fence: tuple[str, int] | None,
    lease_id: str | None,
    handoff_id: str | None,
    checkpoint_id: str | None,
) -> str:
    """Digest of an outcome record (``evidence``: the evidence items as JSON objects;
    ``fence``: ``(lease_id, epoch)`` of the fencing lease, or ``None``)."""
    return request_digest(
        "outcome.record",
        {
            "status": status,
            "evidence": evidence,
            "fence": list(fence) if fence else None,
            "lease_id": lease_id,
            "handoff_id": handoff_id,
            "checkpoint_id": checkpoint_id,
        },
    )


def operation_digest(operation: str, fields: Mapping[str, object]) -> str:
    """Digest of an operation on a lease presented by proof or by id (``renew``,
    ``release``, ``release_by_id``, ``transfer``, ``force_release``) or of a handoff
    ``resolve``: the operation's name and its request ``fields`` as the client gives them.

    Args:
        operation: the operation name (at most 32 characters).
        fields: the request (JSON-representable values).

    Raises:
        ValidationError: ``fields`` is not representable as JSON.
    """
    return request_digest(operation, fields)


def resource_key(resource_type: str, resource_id: str) -> str:
    """Unambiguous key of a resource (length-prefixed, so ids cannot forge separators)."""
    return f"{len(resource_type)}:{resource_type}:{resource_id}"
