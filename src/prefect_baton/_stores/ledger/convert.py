"""Conversions between ledger rows, core generations and public models; event payloads."""

from __future__ import annotations

import json
import uuid
from typing import Any

from prefect_baton._rules import events as _events
from prefect_baton._rules.access import inspect_view
from prefect_baton._rules.core import Generation
from prefect_baton._stores.ledger.tables import (
    CheckpointRow,
    CheckpointVersion,
    GenerationRow,
    HandoffRow,
    OutcomeRow,
)
from prefect_baton._stores.protocol import Caller
from prefect_baton.models import (
    Checkpoint,
    Evidence,
    Handoff,
    Lease,
    LeaseInfo,
    Outcome,
    from_ms,
)


def new_id(prefix: str) -> str:
    """A fresh id: ``prefix_`` + 32 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex}"


def row_to_generation(row: GenerationRow) -> Generation:
    return Generation(
        lease_id=row.lease_id,
        resource_type=row.resource_type,
        resource_id=row.resource_id,
        owner=row.owner,
        execution_key=row.execution_key,
        version=row.version,
        epoch=row.epoch,
        status=row.status,  # type: ignore[arg-type,unused-ignore]
        acquired_at_ms=row.acquired_at_ms,
        expires_at_ms=row.expires_at_ms,
        ttl_ms=row.ttl_ms,
        scopes=tuple(json.loads(row.scopes)),
        purpose=row.purpose,
        ended_at_ms=row.ended_at_ms,
        ended_by=row.ended_by,
    )


def generation_to_lease(h: Generation, *, replayed: bool = False) -> Lease:
    acquired = from_ms(h.acquired_at_ms)
    expires = from_ms(h.expires_at_ms)
    assert acquired is not None and expires is not None
    return Lease(
        lease_id=h.lease_id,
        resource_type=h.resource_type,
        resource_id=h.resource_id,
        owner=h.owner,
        execution_key=h.execution_key,
        version=h.version,
        epoch=h.epoch,
        scopes=h.scopes,
        status=h.status,
        purpose=h.purpose,
        acquired_at=acquired,
        expires_at=expires,
        ttl_seconds=h.ttl_ms // 1000,
        released_at=from_ms(h.ended_at_ms),
        replayed=replayed,
    )


def checkpoint_model(
    row: CheckpointRow, *, saved: CheckpointVersion | None = None, replayed: bool = False
) -> Checkpoint:
    """Checkpoint ``row`` as a model: its current version, or with ``saved`` that one of its
    versions (its state, hash and save time; a version of the history has no expiry)."""
    version: CheckpointRow | CheckpointVersion = row if saved is None else saved
    created = from_ms(row.created_at_ms)
    updated = from_ms(row.updated_at_ms if saved is None else saved.saved_at_ms)
    assert created is not None and updated is not None
    return Checkpoint(
        checkpoint_id=row.checkpoint_id,
        subject_id=row.subject_id,
        kind=row.kind,
        principal=row.principal,
        version=version.version,
        state=json.loads(version.state),
        state_hash=version.state_hash,
        created_at=created,
        updated_at=updated,
        expires_at=from_ms(row.expires_at_ms) if saved is None else None,
        replayed=replayed,
    )


def handoff_model(row: HandoffRow, now_ms: int, lease: Lease | None = None) -> Handoff:
    status = row.status
    if status == "pending" and row.expires_at_ms is not None and row.expires_at_ms <= now_ms:
        status = "expired"
    created = from_ms(row.created_at_ms)
    assert created is not None
    return Handoff(
        handoff_id=row.handoff_id,
        from_principal=row.from_principal,
        to_principal=row.to_principal,
        subject_id=row.subject_id,
        checkpoint_id=row.checkpoint_id,
        context_id=row.context_id,
        message=row.message,
        lease_id=row.lease_id,
        status=status,  # type: ignore[arg-type,unused-ignore]
        created_at=created,
        expires_at=from_ms(row.expires_at_ms),
        resolved_at=from_ms(row.resolved_at_ms),
        note=row.note,
        lease=lease,
    )


def outcome_model(row: OutcomeRow) -> Outcome:
    recorded = from_ms(row.recorded_at_ms)
    assert recorded is not None
    return Outcome(
        outcome_id=row.outcome_id,
        subject_id=row.subject_id,
        principal=row.principal,
        status=row.status,  # type: ignore[arg-type,unused-ignore]
        evidence=tuple(Evidence(**e) for e in json.loads(row.evidence)),
        lease_id=row.lease_id,
        handoff_id=row.handoff_id,
        checkpoint_id=row.checkpoint_id,
        fence_epoch=row.fence_epoch,
        recorded_at=recorded,
    )


def subject_of(resource: tuple[str, str]) -> str:
    return f"{resource[0]}/{resource[1]}"


def lease_payload(h: Generation, resource: tuple[str, str]) -> dict[str, Any]:
    """The lease part of an event payload of generation ``h`` (built by
    :func:`prefect_baton._rules.events.lease_payload`)."""
    return _events.lease_payload(
        h.lease_id, resource[0], resource[1], h.owner, h.version, h.epoch, h.expires_at_ms
    )


def handoff_payload(
    row: HandoffRow, *, accepted_lease_id: str | None = None, epoch: int | None = None
) -> dict[str, Any]:
    """The payload of a ``handoff.*`` event of ``row`` (built by
    :func:`prefect_baton._rules.events.handoff_payload`)."""
    return _events.handoff_payload(
        row.handoff_id,
        row.from_principal,
        row.to_principal,
        row.checkpoint_id,
        row.lease_id,
        accepted_lease_id=accepted_lease_id,
        epoch=epoch,
    )


def lease_info(
    caller: Caller, rtype: str, rid: str, head: Generation | None, now: int
) -> LeaseInfo:
    """What ``caller`` sees of resource ``(rtype, rid)`` whose newest generation is ``head``
    (``None`` if never leased) at ``now`` (epoch ms): the redaction is
    :func:`prefect_baton._rules.access.inspect_view`'s."""
    view = inspect_view(head, principal=caller.principal, now_ms=now)
    return LeaseInfo(
        resource_type=rtype,
        resource_id=rid,
        held=view.held,
        version=view.version,
        epoch=view.epoch,
        expires_at=from_ms(view.expires_at_ms),
        lease=generation_to_lease(view.lease) if view.lease is not None else None,
    )
