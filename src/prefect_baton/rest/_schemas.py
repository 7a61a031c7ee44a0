"""Request bodies of the REST API. Every model forbids unknown fields and is strict about
types (``"600"`` is not an integer); a failure is ``400 VALIDATION_ERROR``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = [
    "AcquireIn",
    "CheckpointIn",
    "EvidenceIn",
    "HandoffIn",
    "OutcomeIn",
    "RenewIn",
    "ResolveIn",
    "TransferIn",
]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AcquireIn(_In):
    """``POST /v1/leases``: acquire a lease (TTL 10..86,400 s)."""

    resource_type: str
    resource_id: str
    ttl_seconds: int
    purpose: str | None = None
    scopes: list[str] = []
    expected_version: int | None = None


class RenewIn(_In):
    """``POST /v1/leases/{id}/renew``: new TTL (default: the lease's own)."""

    ttl_seconds: int | None = None
    expected_version: int | None = None


class TransferIn(_In):
    """``POST /v1/leases/{id}/transfer``: hand the lease to another principal."""

    to_principal: str
    new_execution_key: str
    ttl_seconds: int
    expected_version: int | None = None


class HandoffIn(_In):
    """``POST /v1/handoffs``: a pending handoff; ``lease_id`` names a lease you hold that
    accepting transfers to the recipient."""

    to_principal: str
    subject_id: str
    checkpoint_id: str | None = None
    context_id: str | None = None
    message: str | None = None
    lease_id: str | None = None
    expires_in_seconds: int | None = None


class ResolveIn(_In):
    """``POST /v1/handoffs/{id}/resolve``: ``accepted`` or ``rejected``."""

    status: str
    note: str | None = None
    execution_key: str | None = None
    ttl_seconds: int | None = None


class CheckpointIn(_In):
    """``PUT /v1/checkpoints``: save your checkpoint of ``(subject_id, kind)``;
    ``fence_lease_id`` names a lease you hold that must still be current."""

    subject_id: str
    kind: str
    state: dict[str, Any]
    expected_version: int | None = None
    fence_lease_id: str | None = None
    ttl_seconds: int | None = None


class EvidenceIn(_In):
    """One evidence item of an outcome."""

    kind: str
    uri: str
    digest: str | None = None
    note: str | None = None


class OutcomeIn(_In):
    """``POST /v1/outcomes``: ``succeeded``, ``failed`` or ``cancelled`` with evidence."""

    subject_id: str
    status: str
    evidence: list[EvidenceIn] = []
    fence_lease_id: str | None = None
    lease_id: str | None = None
    handoff_id: str | None = None
    checkpoint_id: str | None = None
