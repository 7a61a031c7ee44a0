"""The MCP tools: one input model (unknown fields rejected, types strict) and one thin call
into :class:`~prefect_baton.Baton` per tool.

A tool returns the JSON form (``model_dump(mode="json")``) of what the Python API returns;
lists come wrapped in an object (``{"handoffs": [...]}``), because a tool's structured
result is a JSON object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prefect_baton._client.sync import Baton
from prefect_baton._rules.validation import (
    CHECKPOINT_TTL_MAX_SECONDS,
    MAX_ID_LENGTH,
    MAX_SAFE_INTEGER,
    MAX_SCOPE_LENGTH,
    MAX_SCOPES,
    MAX_TEXT_LENGTH,
    TTL_MAX_SECONDS,
    TTL_MIN_SECONDS,
    TTL_RANGE,
)
from prefect_baton.errors import NotFoundError, StaleFenceError
from prefect_baton.models import Checkpoint, Handoff, Lease, LeaseInfo, Outcome, Receipt
from prefect_baton.rest import _calls as rest_calls
from prefect_baton.rest import _schemas as rest_schemas

__all__ = ["TOOLS", "ToolSpec"]

Id = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)]
Text = Annotated[str, Field(max_length=MAX_TEXT_LENGTH)]
Ttl = Annotated[
    int,
    Field(
        ge=TTL_MIN_SECONDS, le=TTL_MAX_SECONDS, description=f"Lease TTL in seconds, {TTL_RANGE}."
    ),
]
Version = Annotated[
    int,
    Field(ge=0, le=MAX_SAFE_INTEGER, description="Compare-and-swap version (0 = never written)."),
]
Lifetime = Annotated[int, Field(ge=1, le=CHECKPOINT_TTL_MAX_SECONDS)]
Scope = Annotated[str, Field(min_length=1, max_length=MAX_SCOPE_LENGTH)]
IdempotencyKey = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="Idempotency key: an exact retry replays the stored result.",
    ),
]


class _In(BaseModel):
    """Base of every tool input: unknown fields are rejected and types are strict
    (``"600"`` is not an integer)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class _Fenced(_In):
    """A write that may be fenced by a lease you hold: ``lease_id`` and ``epoch`` together."""

    lease_id: Id | None = Field(
        None,
        description="Fence: the lease this write is made under (give epoch too). The write "
        "is rejected with STALE_FENCE once that lease generation is no longer current.",
    )
    epoch: Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)] | None = Field(
        None, description="Fence: the epoch of that lease (its fencing token)."
    )

    @model_validator(mode="after")
    def _fence_pair(self) -> Self:
        if (self.lease_id is None) != (self.epoch is None):
            raise ValueError("lease_id and epoch are given together (the fence) or not at all")
        return self


class LeaseAcquireIn(_In):
    """Acquire the lease on one resource."""

    resource_type: Id = Field(description="Kind of resource, e.g. 'deploy'.")
    resource_id: Id = Field(description="The resource, e.g. 'checkout-service'.")
    ttl_seconds: Ttl
    purpose: Text | None = Field(None, description="Free text kept with the lease (holder only).")
    scopes: Annotated[list[Scope], Field(max_length=MAX_SCOPES)] = Field(
        default_factory=list,
        description="Write-scope globs (e.g. 'src/**'); overlapping scopes on another "
        "effective lease of the organization conflict.",
    )
    expected_version: Version | None = None
    idempotency_key: IdempotencyKey | None = Field(
        None,
        description="Execution key: acquiring again with it replays the receipt; another "
        "key conflicts while the lease is effective.",
    )


class LeaseByIdIn(_In):
    """Renew a lease you hold."""

    lease_id: Id = Field(description="The lease id returned by baton_lease_acquire.")
    ttl_seconds: Ttl | None = Field(None, description="New TTL (default: the lease's own).")
    expected_version: Version | None = None
    idempotency_key: IdempotencyKey | None = None


class LeaseReleaseIn(_In):
    """Release a lease you hold."""

    lease_id: Id = Field(description="The lease id returned by baton_lease_acquire.")
    expected_version: Version | None = None
    idempotency_key: IdempotencyKey | None = None


class ResourceIn(_In):
    """Name one resource."""

    resource_type: Id
    resource_id: Id


class CheckpointSaveIn(_Fenced):
    """Save your checkpoint of a subject and kind."""

    subject_id: Id = Field(description="What the progress is about, e.g. a ticket id.")
    kind: Id = Field(description="Which checkpoint of the subject, e.g. 'progress'.")
    state: dict[str, Any] = Field(description="The resumable state, a JSON object (<= 1 MiB).")
    expected_version: Version | None = None
    ttl_seconds: Lifetime | None = Field(
        None, description="Seconds (1 to 31622400) after which it is no longer returned."
    )
    idempotency_key: IdempotencyKey | None = None


class CheckpointGetIn(_In):
    """Read a checkpoint: by subject_id and kind, or by checkpoint_id."""

    subject_id: Id | None = None
    kind: Id | None = None
    principal: Id | None = Field(
        None, description="Whose checkpoint of subject_id/kind (default: yours)."
    )
    checkpoint_id: Id | None = Field(
        None, description="Read by id instead (e.g. the checkpoint attached to a handoff)."
    )

    @model_validator(mode="after")
    def _one_way(self) -> Self:
        by_subject = self.subject_id is not None or self.kind is not None
        if self.checkpoint_id is not None:
            if by_subject or self.principal is not None:
                raise ValueError("give checkpoint_id alone, or subject_id and kind")
        elif self.subject_id is None or self.kind is None:
            raise ValueError("give subject_id and kind, or checkpoint_id")
        return self


class HandoffCreateIn(_In):
    """Create a pending handoff addressed to another principal."""

    to_principal: Id = Field(description="Who should continue (need not have acted yet).")
    subject_id: Id
    checkpoint_id: Id | None = Field(None, description="A checkpoint the recipient may read.")
    context_id: Id | None = None
    message: Text | None = None
    lease_id: Id | None = Field(
        None,
        description="A lease you hold; accepting the handoff transfers it to the recipient.",
    )
    expires_in_seconds: Lifetime | None = Field(
        None, description="After this many seconds a pending handoff reads as expired."
    )
    idempotency_key: IdempotencyKey | None = None


class HandoffInboxIn(_In):
    """List the pending handoffs addressed to you."""

    limit: Annotated[int, Field(ge=1, le=10_000)] = 100


class HandoffResolveIn(_In):
    """Accept or reject a pending handoff addressed to you."""

    handoff_id: Id
    status: Literal["accepted", "rejected"]
    note: Text | None = None
    execution_key: Id | None = Field(
        None,
        description="Execution key of the lease you receive on accepting "
        "(default 'handoff:<handoff_id>').",
    )
    ttl_seconds: Ttl | None = Field(
        None, description="TTL of the lease you receive (default: the sender's)."
    )
    idempotency_key: IdempotencyKey | None = None


class HandoffShowIn(_In):
    """Show one handoff you sent or received."""

    handoff_id: Id


class EvidenceIn(rest_schemas.EvidenceIn):
    """One evidence item of an outcome."""

    # The REST item's limits, with a description of ``kind`` for the agent, and a ``note``
    # without the REST pattern (the Python API refuses a NUL all the same).
    kind: rest_schemas.EvidenceKind = Field(description="e.g. 'file', 'log', 'ci-run'.")
    note: Text | None = None


class OutcomeRecordIn(_Fenced):
    """Record the outcome of a subject, with evidence."""

    subject_id: Id
    status: Literal["succeeded", "failed", "cancelled"]
    evidence: Annotated[list[EvidenceIn], Field(max_length=1000)] = Field(
        default_factory=list, description="At least one item for 'succeeded'."
    )
    handoff_id: Id | None = None
    checkpoint_id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


class HandoffList(BaseModel):
    """The result of ``baton_handoff_inbox``."""

    handoffs: list[Handoff]


def _json(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")


def _fence(b: Baton, lease_id: str | None, epoch: int | None) -> Lease | None:
    """The lease generation ``lease_id`` presented with ``epoch`` as a fence.

    Raises:
        StaleFenceError: the id is not one of the caller's leases (the store then judges
            an ended, expired or wrong-epoch generation the same way).
    """
    if lease_id is None or epoch is None:
        return None
    try:
        lease = b.leases.get(lease_id)
    except NotFoundError:
        raise StaleFenceError(
            f"fence lease {lease_id} is not a current lease of the writer"
        ) from None
    return lease if lease.epoch == epoch else lease.model_copy(update={"epoch": epoch})


def _lease_acquire(b: Baton, a: LeaseAcquireIn) -> dict[str, Any]:
    return _json(rest_calls.acquire(b, a, a.idempotency_key))


def _lease_renew(b: Baton, a: LeaseByIdIn) -> dict[str, Any]:
    lease = b.leases.get(a.lease_id)
    return _json(rest_calls.renew(b, lease, a, a.idempotency_key))


def _lease_release(b: Baton, a: LeaseReleaseIn) -> dict[str, Any]:
    lease = b.leases.get(a.lease_id)
    return _json(
        b.leases.release(
            lease, expected_version=a.expected_version, idempotency_key=a.idempotency_key
        )
    )


def _lease_inspect(b: Baton, a: ResourceIn) -> dict[str, Any]:
    return _json(b.leases.inspect(a.resource_type, a.resource_id))


def _checkpoint_save(b: Baton, a: CheckpointSaveIn) -> dict[str, Any]:
    fence = _fence(b, a.lease_id, a.epoch)
    return _json(rest_calls.save_checkpoint(b, a, fence, a.idempotency_key))


def _checkpoint_get(b: Baton, a: CheckpointGetIn) -> dict[str, Any]:
    if a.checkpoint_id is not None:
        return _json(b.checkpoints.get_by_id(a.checkpoint_id))
    assert a.subject_id is not None and a.kind is not None  # the model checked it
    found = b.checkpoints.get(a.subject_id, a.kind, a.principal)
    if found is None:
        raise NotFoundError(f"no checkpoint of {a.subject_id}/{a.kind}")
    return _json(found)


def _handoff_create(b: Baton, a: HandoffCreateIn) -> dict[str, Any]:
    lease = b.leases.get(a.lease_id) if a.lease_id is not None else None
    return _json(rest_calls.create_handoff(b, a, lease, a.idempotency_key))


def _handoff_inbox(b: Baton, a: HandoffInboxIn) -> dict[str, Any]:
    return {"handoffs": [_json(h) for h in b.handoffs.inbox(limit=a.limit)]}


def _handoff_resolve(b: Baton, a: HandoffResolveIn) -> dict[str, Any]:
    return _json(rest_calls.resolve_handoff(b, a.handoff_id, a, a.idempotency_key))


def _handoff_show(b: Baton, a: HandoffShowIn) -> dict[str, Any]:
    return _json(b.handoffs.get(a.handoff_id))


def _outcome_record(b: Baton, a: OutcomeRecordIn) -> dict[str, Any]:
    fence = _fence(b, a.lease_id, a.epoch)
    return _json(rest_calls.record_outcome(b, a, fence, a.idempotency_key))


@dataclass(frozen=True)
class ToolSpec:
    """One MCP tool.

    Attributes:
        name: the tool name (``baton_<area>_<verb>``).
        description: what it does and how it fails, for the agent reading the tool list.
        model: the input model (its JSON schema is the tool's ``inputSchema``).
        run: ``run(baton, args) -> dict``, the thin call into the Python API; raises
            :class:`~prefect_baton.errors.BatonError` subclasses.
        output: the model whose JSON form ``run`` returns (its serialization schema is
            the tool's ``outputSchema``).
        scope: the bearer-key scope it needs over HTTP (``<area>:read`` / ``<area>:write``).
        read_only: whether it changes nothing (the ``readOnlyHint`` annotation).
    """

    name: str
    description: str
    model: type[_In]
    run: Callable[[Baton, Any], dict[str, Any]]
    output: type[BaseModel]
    scope: str
    read_only: bool = False


_SPECS = (
    ToolSpec(
        "baton_lease_acquire",
        "Claim expiring ownership of one resource before doing work on it. Returns the "
        "lease (lease_id, epoch = fencing token, version, expires_at). Errors: CONFLICT "
        "while another holder has it (the message gives only the expiry), VERSION_CONFLICT, "
        "IDEMPOTENCY_MISMATCH, LEASE_LOST (a replayed acquire whose lease has ended).",
        LeaseAcquireIn,
        _lease_acquire,
        Lease,
        "leases:write",
    ),
    ToolSpec(
        "baton_lease_renew",
        "Extend a lease you hold: expiry = now + ttl_seconds; id and epoch stay. Errors: "
        "LEASE_LOST once it has ended or expired (never silently re-acquired), NOT_FOUND "
        "for a lease that is not yours.",
        LeaseByIdIn,
        _lease_renew,
        Lease,
        "leases:write",
    ),
    ToolSpec(
        "baton_lease_release",
        "Release a lease you hold. The receipt's status is 'released', 'expired' (your "
        "protection had lapsed) or 'no_change' (already released: safe to retry). Errors: "
        "LEASE_LOST when someone else has taken it since, NOT_FOUND when not yours.",
        LeaseReleaseIn,
        _lease_release,
        Receipt,
        "leases:write",
    ),
    ToolSpec(
        "baton_lease_inspect",
        "Whether a resource is held and until when, with its version and epoch. Only the "
        "holder sees the full lease.",
        ResourceIn,
        _lease_inspect,
        LeaseInfo,
        "leases:read",
        read_only=True,
    ),
    ToolSpec(
        "baton_checkpoint_save",
        "Save your resumable progress for (subject_id, kind); version +1 per write. Pass "
        "lease_id and epoch to fence the write with a lease you hold. Errors: STALE_FENCE, "
        "VERSION_CONFLICT (expected_version differs), IDEMPOTENCY_MISMATCH.",
        CheckpointSaveIn,
        _checkpoint_save,
        Checkpoint,
        "checkpoints:write",
    ),
    ToolSpec(
        "baton_checkpoint_get",
        "Read the current checkpoint of (subject_id, kind) (yours unless principal is "
        "given), or one by checkpoint_id (e.g. attached to a handoff). Errors: NOT_FOUND.",
        CheckpointGetIn,
        _checkpoint_get,
        Checkpoint,
        "checkpoints:read",
        read_only=True,
    ),
    ToolSpec(
        "baton_handoff_create",
        "Hand a subject to another principal, optionally with a checkpoint and a lease you "
        "hold (it moves to the recipient when they accept). Errors: NOT_FOUND (unknown "
        "checkpoint or lease), LEASE_LOST, VALIDATION_ERROR (a handoff to yourself).",
        HandoffCreateIn,
        _handoff_create,
        Handoff,
        "handoffs:write",
    ),
    ToolSpec(
        "baton_handoff_inbox",
        "The pending handoffs addressed to you, as {'handoffs': [...]} (a sender's own "
        "inbox stays empty).",
        HandoffInboxIn,
        _handoff_inbox,
        HandoffList,
        "handoffs:read",
        read_only=True,
    ),
    ToolSpec(
        "baton_handoff_resolve",
        "Accept or reject a pending handoff addressed to you. Accepting one that carries a "
        "lease gives you that lease (in the result's 'lease'). Errors: NOT_FOUND (unknown, "
        "expired or already resolved), VALIDATION_ERROR (not addressed to you), LEASE_LOST (the "
        "sender no longer holds the lease).",
        HandoffResolveIn,
        _handoff_resolve,
        Handoff,
        "handoffs:write",
    ),
    ToolSpec(
        "baton_handoff_show",
        "One handoff you sent or received, with its status. Errors: NOT_FOUND.",
        HandoffShowIn,
        _handoff_show,
        Handoff,
        "handoffs:read",
        read_only=True,
    ),
    ToolSpec(
        "baton_outcome_record",
        "Record 'succeeded', 'failed' or 'cancelled' for a subject with evidence items "
        "(kind, uri, digest, note). Pass lease_id and epoch to fence it with a lease you "
        "hold. Errors: STALE_FENCE, NOT_FOUND (a linked id), IDEMPOTENCY_MISMATCH.",
        OutcomeRecordIn,
        _outcome_record,
        Outcome,
        "outcomes:write",
    ),
)

#: Every tool, by name, in the order they are listed.
TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in _SPECS}
