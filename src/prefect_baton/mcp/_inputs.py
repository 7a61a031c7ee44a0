"""The MCP tools' input models: one per tool, unknown fields rejected, types strict, with
the field types of the REST API (:mod:`prefect_baton.rest._schemas`: the bounds of
:mod:`prefect_baton._rules.validation`, no control characters in ids) (see
:mod:`prefect_baton.mcp._tools` for the tools that take them)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prefect_baton._rules.paging import MAX_PAGE
from prefect_baton._rules.validation import LIFETIME_RANGE, MAX_SAFE_INTEGER, TTL_RANGE
from prefect_baton.rest import _schemas as rest_schemas
from prefect_baton.rest._schemas import Id, Lifetime, Scopes, Text

# with a description for the tool schemas where the field name does not say enough
Ttl = Annotated[rest_schemas.Ttl, Field(description=f"Lease TTL in seconds, {TTL_RANGE}.")]
Version = Annotated[
    rest_schemas.Version, Field(description="Compare-and-swap version (0 = never written).")
]
IdempotencyKey = Annotated[
    Id, Field(description="Idempotency key: an exact retry replays the stored result.")
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
        rest_schemas.paired(self, "lease_id", "epoch", "the fence", lead_alone=False)
        return self


class LeaseAcquireIn(_In):
    """Acquire the lease on one resource."""

    resource_type: Id = Field(description="Kind of resource, e.g. 'deploy'.")
    resource_id: Id = Field(description="The resource, e.g. 'checkout-service'.")
    ttl_seconds: Ttl
    purpose: Text | None = Field(None, description="Free text kept with the lease (holder only).")
    scopes: Scopes = Field(
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


class CheckpointSaveIn(_Fenced):
    """Save your checkpoint of a subject and kind."""

    subject_id: Id = Field(description="What the progress is about, e.g. a ticket id.")
    kind: Id = Field(description="Which checkpoint of the subject, e.g. 'progress'.")
    state: dict[str, Any] = Field(description="The resumable state, a JSON object (<= 1 MiB).")
    expected_version: Version | None = None
    ttl_seconds: Lifetime | None = Field(
        None, description=f"Seconds ({LIFETIME_RANGE}) after which it is no longer returned."
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
    parameters: dict[str, Any] | None = Field(
        None, description="Parameters for the recipient's run (a JSON object)."
    )
    idempotency_key: IdempotencyKey | None = None


Cursor = Annotated[
    str,
    Field(
        min_length=1,
        max_length=1024,
        description="The next_cursor of the previous page (absent: the first page).",
    ),
]


class HandoffInboxIn(_In):
    """List the pending handoffs addressed to you (or, with party, those a principal sent
    or received, or everyone's), one page at a time."""

    limit: Annotated[int, Field(ge=1, le=10_000)] = 100
    cursor: Cursor | None = None
    party: Id | None = Field(
        None,
        description="Instead of your inbox: the handoffs this principal sent or received "
        "(your own name: yours), or '*' for everyone's in the organization (another's or "
        "everyone's needs the owner/admin role).",
    )
    status: Literal["pending", "accepted", "rejected", "expired", "any"] | None = Field(
        None, description="With party only: the status to list (default pending)."
    )


class LeaseTransferIn(_In):
    """Hand a lease you hold to another principal."""

    lease_id: Id = Field(description="The lease you hold.")
    to_principal: Id = Field(description="Who receives it (need not have acted yet).")
    new_execution_key: Id = Field(
        description="The receiver's execution key (must differ from yours)."
    )
    ttl_seconds: Ttl
    expected_version: Version | None = None
    idempotency_key: IdempotencyKey | None = None


class LeaseForceReleaseIn(_In):
    """Release anyone's lease of the organization (owner/admin role)."""

    lease_id: Id
    idempotency_key: IdempotencyKey | None = None


class LeaseAcquireManyIn(rest_schemas.BatchIn):
    """Acquire several resources all-or-nothing."""

    idempotency_key: IdempotencyKey | None = Field(
        None, description="Execution key of every lease of the batch (see baton_lease_acquire)."
    )


class LeaseListIn(_In):
    """List your leases (a lost lease_id is found here), newest first, one page at a time."""

    resource_type: Id | None = None
    owner: Id | None = Field(
        None, description="Another principal's leases, or '*' for all (owner/admin role)."
    )
    include_ended: bool = Field(False, description="Also ended generations (history).")
    limit: Annotated[int, Field(ge=1, le=10_000)] = 100
    cursor: Cursor | None = None


class EventListIn(_In):
    """Read the organization's event stream in commit order, one page at a time."""

    after: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = Field(
        None, description="Events with seq above this (or give cursor; neither: from the start)."
    )
    limit: Annotated[int, Field(ge=1, le=1000)] = 100
    kind: Id | None = Field(None, description="Only this kind, e.g. 'lease.acquired'.")
    cursor: Cursor | None = None
    resource_type: Id | None = Field(
        None,
        description="With resource_id: only the events of this resource's leases (lease.*, "
        "fence.rejected, and handoff.* of handoffs that carried one).",
    )
    resource_id: Id | None = Field(None, description="With resource_type: that resource's id.")
    subject: Id | None = Field(
        None, description="Only events with exactly this subject (a subject_id)."
    )


class CheckpointHistoryIn(_In):
    """The versions of a checkpoint, oldest first, one page at a time."""

    subject_id: Id
    kind: Id
    principal: Id | None = Field(None, description="Whose checkpoint (default: yours).")
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE["checkpoints"])] = 100
    cursor: Cursor | None = None


class CheckpointDeleteIn(_In):
    """Delete a checkpoint you wrote."""

    checkpoint_id: Id
    idempotency_key: IdempotencyKey | None = None


class OutcomeListIn(_In):
    """List outcomes of the organization, oldest first."""

    subject_id: Id | None = Field(None, description="Only this subject's.")
    limit: Annotated[int, Field(ge=1, le=100_000)] = 1000
    cursor: Cursor | None = None


class WhoAmIIn(_In):
    """Who this connection acts as (no arguments)."""


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
