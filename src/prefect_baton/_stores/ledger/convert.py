"""Conversions between ledger rows, core generations and public models; event payloads."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from sqlalchemy import Row

from prefect_baton._ids import random_uuid4_hex
from prefect_baton._rules import events as _events
from prefect_baton._rules.access import inspect_view
from prefect_baton._rules.core import Generation
from prefect_baton._rules.handoffs import handoff_status
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
    return f"{prefix}_{random_uuid4_hex()}"


def shared_fields(target: Iterable[str], source: Iterable[str], *but: str) -> tuple[str, ...]:
    """The field names of ``target`` that ``source`` also has, except ``but``: the fields a
    conversion copies as they are (the others it converts itself)."""
    names = set(source)
    return tuple(name for name in target if name in names and name not in but)


def copy_fields(source: object, names: tuple[str, ...]) -> dict[str, Any]:
    """``source``'s attributes ``names``, as keyword arguments of the target."""
    return {name: getattr(source, name) for name in names}


#: The fields of a core :class:`Generation`.
GENERATION_FIELDS = tuple(f.name for f in fields(Generation))
#: Copied from a ledger row to a :class:`Generation`: every field but the scopes (JSON).
_FROM_ROW = shared_fields(GENERATION_FIELDS, GenerationRow.model_fields, "scopes")
#: Copied from a :class:`Generation` to a :class:`Lease` (times are converted).
_TO_LEASE = shared_fields(Lease.model_fields, GENERATION_FIELDS)
_TO_CHECKPOINT = shared_fields(
    Checkpoint.model_fields, CheckpointRow.model_fields, "version", "state", "state_hash"
)
_TO_HANDOFF = shared_fields(Handoff.model_fields, HandoffRow.model_fields, "status")
_TO_OUTCOME = shared_fields(Outcome.model_fields, OutcomeRow.model_fields, "evidence")


def row_to_generation(row: Any) -> Generation:
    """The core's view of a lease row: a :class:`GenerationRow`, or any row with its columns
    as attributes (a result row, a named tuple)."""
    return Generation(**copy_fields(row, _FROM_ROW), scopes=tuple(json.loads(row.scopes)))


def generation_to_lease(h: Generation, *, replayed: bool = False) -> Lease:
    acquired = from_ms(h.acquired_at_ms)
    expires = from_ms(h.expires_at_ms)
    assert acquired is not None and expires is not None
    return Lease(
        **copy_fields(h, _TO_LEASE),
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
        **copy_fields(row, _TO_CHECKPOINT),
        version=version.version,
        state=json.loads(version.state),
        state_hash=version.state_hash,
        created_at=created,
        updated_at=updated,
        expires_at=from_ms(row.expires_at_ms) if saved is None else None,
        replayed=replayed,
    )


def handoff_model(
    row: HandoffRow,
    now_ms: int,
    lease: Lease | None = None,
    *,
    carried_ended: bool = False,
    released: Lease | None = None,
) -> Handoff:
    """The :class:`Handoff` of ``row`` at ``now_ms``; its status as
    :func:`prefect_baton._rules.handoffs.handoff_status` reads it (``carried_ended``: the lease
    it carries is no longer in effect, :func:`prefect_baton._rules.handoffs.carried_lease_ended`;
    ``released``: the carried lease this call released, see ``Handoff.released_lease``)."""
    status = handoff_status(row.status, row.expires_at_ms, now_ms, carried_ended=carried_ended)
    created = from_ms(row.created_at_ms)
    assert created is not None
    return Handoff(
        **copy_fields(row, _TO_HANDOFF),
        status=status,
        created_at=created,
        expires_at=from_ms(row.expires_at_ms),
        resolved_at=from_ms(row.resolved_at_ms),
        lease=lease,
        released_lease=released,
        parameters=json.loads(row.parameters_json) if row.parameters_json else None,
    )


def outcome_model(row: OutcomeRow) -> Outcome:
    recorded = from_ms(row.recorded_at_ms)
    assert recorded is not None
    return Outcome(
        **copy_fields(row, _TO_OUTCOME),
        evidence=tuple(Evidence(**e) for e in json.loads(row.evidence)),
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
    row: HandoffRow | Row[Any], *, accepted_lease_id: str | None = None, epoch: int | None = None
) -> dict[str, Any]:
    """The payload of a ``handoff.*`` event of ``row`` (a :class:`HandoffRow`, or a result
    row of a Core ``select(HandoffRow)``; built by
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
