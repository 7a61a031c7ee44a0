"""The calls into :class:`~prefect_baton.Baton` that the REST routes and the MCP tools
share: each takes the request model of either server (any object with the fields its
protocol names), so how a request's fields map onto the Python API is written once.

What the two servers do differently stays with them: the idempotency key (a header or a
tool argument) and the lease a fence or proof presents are given as arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from prefect_baton._client.sync import Baton
from prefect_baton.models import Checkpoint, Handoff, Lease, Outcome

__all__ = [
    "acquire",
    "create_handoff",
    "record_outcome",
    "renew",
    "resolve_handoff",
    "save_checkpoint",
]


class AcquireFields(Protocol):
    """The fields of a lease acquisition (REST ``AcquireIn``, MCP ``LeaseAcquireIn``)."""

    resource_type: str
    resource_id: str
    ttl_seconds: int
    purpose: str | None
    scopes: list[str]
    expected_version: int | None


class RenewFields(Protocol):
    """The fields of a lease renewal (REST ``RenewIn``, MCP ``LeaseByIdIn``)."""

    ttl_seconds: int | None
    expected_version: int | None


class CheckpointFields(Protocol):
    """The fields of a checkpoint save (REST ``CheckpointIn``, MCP ``CheckpointSaveIn``)."""

    subject_id: str
    kind: str
    state: dict[str, Any]
    expected_version: int | None
    ttl_seconds: int | None


class HandoffFields(Protocol):
    """The fields of a handoff (REST ``HandoffIn``, MCP ``HandoffCreateIn``)."""

    to_principal: str
    subject_id: str
    checkpoint_id: str | None
    context_id: str | None
    message: str | None
    expires_in_seconds: int | None


class ResolveFields(Protocol):
    """The fields of a handoff resolution (REST ``ResolveIn``, MCP ``HandoffResolveIn``)."""

    status: Literal["accepted", "rejected"]
    note: str | None
    execution_key: str | None
    ttl_seconds: int | None


class OutcomeFields(Protocol):
    """The fields of an outcome (REST ``OutcomeIn``, MCP ``OutcomeRecordIn``)."""

    subject_id: str
    status: Literal["succeeded", "failed", "cancelled"]
    lease_id: str | None
    handoff_id: str | None
    checkpoint_id: str | None

    @property
    def evidence(self) -> Sequence[BaseModel]:
        """The evidence items (read-only, so either server's item model fits)."""
        ...


def acquire(
    b: Baton, a: AcquireFields, idempotency_key: str | None, attempt: str | None = None
) -> Lease:
    """:meth:`Baton.leases.acquire <prefect_baton._client.leases.Leases.acquire>` with the
    fields of ``a``, ``idempotency_key`` and ``attempt`` (``str`` or ``None``).

    Raises:
        BatonError: as that method (CONFLICT, VERSION_CONFLICT, ...).
    """
    return b.leases.acquire(
        a.resource_type,
        a.resource_id,
        ttl_seconds=a.ttl_seconds,
        purpose=a.purpose,
        scopes=a.scopes,
        expected_version=a.expected_version,
        idempotency_key=idempotency_key,
        attempt=attempt,
    )


def renew(b: Baton, lease: Lease, a: RenewFields, idempotency_key: str | None) -> Lease:
    """``b.leases.renew`` of ``lease`` (the caller's proof, a
    :class:`~prefect_baton.models.Lease`) with the fields of ``a``.

    Raises:
        BatonError: as that method (LEASE_LOST, VERSION_CONFLICT, ...).
    """
    return b.leases.renew(
        lease,
        ttl_seconds=a.ttl_seconds,
        expected_version=a.expected_version,
        idempotency_key=idempotency_key,
    )


def save_checkpoint(
    b: Baton, a: CheckpointFields, fence: Lease | None, idempotency_key: str | None
) -> Checkpoint:
    """``b.checkpoints.save`` with the fields of ``a``, fenced by ``fence`` (a
    :class:`~prefect_baton.models.Lease` or ``None``).

    Raises:
        BatonError: as that method (STALE_FENCE, VERSION_CONFLICT, ...).
    """
    return b.checkpoints.save(
        a.subject_id,
        a.kind,
        a.state,
        expected_version=a.expected_version,
        fence=fence,
        idempotency_key=idempotency_key,
        ttl_seconds=a.ttl_seconds,
    )


def create_handoff(
    b: Baton, a: HandoffFields, lease: Lease | None, idempotency_key: str | None
) -> Handoff:
    """``b.handoffs.create`` with the fields of ``a``, carrying ``lease`` (a
    :class:`~prefect_baton.models.Lease` the caller holds, or ``None``).

    Raises:
        BatonError: as that method (NOT_FOUND, LEASE_LOST, VALIDATION_ERROR, ...).
    """
    return b.handoffs.create(
        a.to_principal,
        a.subject_id,
        checkpoint_id=a.checkpoint_id,
        context_id=a.context_id,
        message=a.message,
        lease=lease,
        idempotency_key=idempotency_key,
        expires_in_seconds=a.expires_in_seconds,
    )


def resolve_handoff(
    b: Baton, handoff_id: str, a: ResolveFields, idempotency_key: str | None
) -> Handoff:
    """``b.handoffs.resolve`` of ``handoff_id`` (``str``) with the fields of ``a``.

    Raises:
        BatonError: as that method (NOT_FOUND, FORBIDDEN, LEASE_LOST, ...).
    """
    return b.handoffs.resolve(
        handoff_id,
        a.status,
        a.note,
        execution_key=a.execution_key,
        ttl_seconds=a.ttl_seconds,
        idempotency_key=idempotency_key,
    )


def record_outcome(
    b: Baton, a: OutcomeFields, fence: Lease | None, idempotency_key: str | None
) -> Outcome:
    """``b.outcomes.record`` with the fields of ``a`` (its evidence items as dicts),
    fenced by ``fence`` (a :class:`~prefect_baton.models.Lease` or ``None``).

    Raises:
        BatonError: as that method (STALE_FENCE, NOT_FOUND, ...).
    """
    return b.outcomes.record(
        a.subject_id,
        a.status,
        evidence=[e.model_dump() for e in a.evidence],
        fence=fence,
        lease_id=a.lease_id,
        handoff_id=a.handoff_id,
        checkpoint_id=a.checkpoint_id,
        idempotency_key=idempotency_key,
    )
