"""The record routes of the REST API: handoffs, checkpoints, outcomes and events
(with their request bodies), registered on the app by :func:`add_routes`."""

from __future__ import annotations

from typing import Annotated, Self

from fastapi import FastAPI, Query, Request
from pydantic import BaseModel, Field, model_validator
from starlette.responses import Response

from prefect_baton.errors import NotFoundError
from prefect_baton.rest import _calls
from prefect_baton.rest import _schemas as s
from prefect_baton.rest._deps import (
    B,
    Epoch,
    ExecutionKey,
    IdemKey,
    Limit,
    _fence,
    _proof_lease,
    _reply,
    _utf8,
)


class HandoffListQuery(BaseModel):
    """The query of ``GET /v1/handoffs``: the inbox, or a party's handoffs of a status, one
    page (the client checks them)."""

    limit: Limit = 100
    cursor: str | None = None
    party: str | None = Field(
        None,
        description="Instead of the inbox: the handoffs this principal sent or received "
        "(your own name: yours), or '*' for everyone's in the org; another's or everyone's "
        "needs the owner or admin role (else 403 FORBIDDEN).",
    )
    status: str | None = Field(
        None,
        description="With party only (else 400): pending (default), accepted, rejected, "
        "expired or any.",
    )


class OutcomeListQuery(BaseModel):
    """The query of ``GET /v1/outcomes``: a subject's outcomes (all without one), one page
    (the client checks them)."""

    subject_id: str | None = None
    limit: Limit = 1000
    cursor: str | None = None


class CheckpointHistoryQuery(BaseModel):
    """The query of ``GET /v1/checkpoints/history``: the checkpoint and the page (the
    client checks them)."""

    subject_id: str
    kind: str
    principal: str | None = None
    limit: Limit = 100
    cursor: str | None = None


class EventListQuery(BaseModel):
    """The query of ``GET /v1/events``: its filters and page (the client checks them)."""

    after: s.After | None = None
    limit: Limit = 100
    kind: str | None = None
    cursor: str | None = None
    resource_type: str | None = None
    resource_id: str | None = None
    subject: str | None = None


class HandoffProofIn(s.HandoffIn):
    """``POST /v1/handoffs``; ``lease_execution_key`` is the execution key presented with
    ``lease_id`` (absent: the lease's own)."""

    lease_execution_key: ExecutionKey | None = None

    @model_validator(mode="after")
    def _paired(self) -> Self:
        s.paired(self, "lease_id", "lease_execution_key", "the lease proof", lead_alone=True)
        return self


class _FenceEpoch(BaseModel):
    """The REST half of a fence, mixed into a body that has ``fence_lease_id``:
    ``fence_epoch`` is the epoch the writer presents with ``fence_lease_id`` (default: that
    lease's own); an epoch without the lease id is refused."""

    fence_epoch: Epoch | None = None

    @model_validator(mode="after")
    def _paired(self) -> Self:
        s.paired(self, "fence_lease_id", "fence_epoch", "the fence", lead_alone=True)
        return self


class FencedCheckpointIn(_FenceEpoch, s.CheckpointIn):
    """``PUT /v1/checkpoints``; ``fence_epoch`` is the epoch the writer presents with
    ``fence_lease_id`` (default: that lease's own)."""


class FencedOutcomeIn(_FenceEpoch, s.OutcomeIn):
    """``POST /v1/outcomes``; ``fence_epoch`` as for checkpoints."""


def add_routes(app: FastAPI) -> None:
    """Register the handoff, checkpoint, outcome and event routes on ``app`` (called once by
    :func:`~prefect_baton.rest.app.create_app`)."""

    @app.post("/v1/handoffs", status_code=201, tags=["handoffs"])
    def create_handoff(
        request: Request, body: HandoffProofIn, b: B, key: IdemKey = None
    ) -> Response:
        """Create a pending handoff addressed to ``to_principal``."""
        lid = body.lease_id
        lease = None if lid is None else _proof_lease(b, lid, body, "lease_execution_key")
        handoff = _calls.create_handoff(b, body, lease, _utf8(key))
        return _reply(request, handoff, status=201)

    @app.get("/v1/handoffs", tags=["handoffs"])
    def inbox(request: Request, b: B, q: Annotated[HandoffListQuery, Query()]) -> Response:
        """Without ``party``: pending handoffs addressed to the caller (the inbox). With
        ``party``: handoffs sent or received by that principal (your own name: yours;
        another's, or ``*`` for everyone's in the org, needs owner/admin, else 403) that
        read as ``status`` (``pending`` by default, ``accepted``, ``rejected``,
        ``expired`` or ``any``; only with ``party``). Oldest first, one page of
        ``limit``; ``next_cursor`` (as ``cursor=``) gives the next page."""
        return _reply(request, _calls.handoffs_page(b, q))

    @app.get("/v1/handoffs/{handoff_id}", tags=["handoffs"])
    def show_handoff(request: Request, handoff_id: str, b: B) -> Response:
        """A handoff you sent or received."""
        return _reply(request, b.handoffs.get(handoff_id))

    @app.post("/v1/handoffs/{handoff_id}/resolve", tags=["handoffs"])
    def resolve(
        request: Request, handoff_id: str, body: s.ResolveIn, b: B, key: IdemKey = None
    ) -> Response:
        """Accept or reject a pending handoff addressed to you; a second resolve is 404."""
        return _reply(request, _calls.resolve_handoff(b, handoff_id, body, _utf8(key)))

    # ------------------------------------------------------------------ checkpoints

    def save(request: Request, body: FencedCheckpointIn, b: B, key: IdemKey = None) -> Response:
        """Write your checkpoint of ``(subject_id, kind)``; version +1 per write (``PUT``,
        or ``POST`` as the seed service's clients send it)."""
        fence = _fence(b, body.fence_lease_id, body.fence_epoch)
        return _reply(request, _calls.save_checkpoint(b, body, fence, _utf8(key)))

    app.put("/v1/checkpoints", tags=["checkpoints"])(save)
    app.post("/v1/checkpoints", tags=["checkpoints"])(save)

    @app.get("/v1/checkpoints", tags=["checkpoints"])
    def get_checkpoint(
        request: Request, b: B, subject_id: str, kind: str, principal: str | None = None
    ) -> Response:
        """The current checkpoint of ``(subject_id, principal or you, kind)``; 404 if none."""
        ck = b.checkpoints.get(subject_id, kind, principal)
        if ck is None:
            raise NotFoundError("no checkpoint for that subject and kind")
        return _reply(request, ck)

    @app.get("/v1/checkpoints/history", tags=["checkpoints"])
    def history(request: Request, b: B, q: Annotated[CheckpointHistoryQuery, Query()]) -> Response:
        """The versions of the checkpoint of ``(subject_id, principal or you, kind)``,
        oldest first, one page of ``limit`` (1..100); ``next_cursor`` (as ``cursor=``)
        gives the next page."""
        return _reply(request, _calls.checkpoint_history(b, q))

    @app.get("/v1/checkpoints/{checkpoint_id}", tags=["checkpoints"])
    def get_checkpoint_by_id(request: Request, checkpoint_id: str, b: B) -> Response:
        """A checkpoint of the org by id (e.g. the one attached to a handoff)."""
        return _reply(request, b.checkpoints.get_by_id(checkpoint_id))

    @app.delete("/v1/checkpoints/{checkpoint_id}", tags=["checkpoints"])
    def delete_checkpoint(
        request: Request, checkpoint_id: str, b: B, key: IdemKey = None
    ) -> Response:
        """Delete your checkpoint: it reads as absent from then on (history kept,
        ``checkpoint.deleted`` recorded); 403 when not yours, 409 CONFLICT while a pending
        handoff carries it, 404 when unknown or already deleted."""
        return _reply(request, _calls.delete_checkpoint(b, checkpoint_id, _utf8(key)))

    # ------------------------------------------------------------------ outcomes, events

    @app.post("/v1/outcomes", status_code=201, tags=["outcomes"])
    def record(request: Request, body: FencedOutcomeIn, b: B, key: IdemKey = None) -> Response:
        """Record ``succeeded``, ``failed`` or ``cancelled`` for a subject."""
        fence = _fence(b, body.fence_lease_id, body.fence_epoch)
        outcome = _calls.record_outcome(b, body, fence, _utf8(key))
        return _reply(request, outcome, status=201)

    @app.get("/v1/outcomes", tags=["outcomes"])
    def outcomes(request: Request, b: B, q: Annotated[OutcomeListQuery, Query()]) -> Response:
        """Outcomes of the org, of one subject when given, oldest first (by record time,
        then outcome id), one page of ``limit``; ``next_cursor`` (as ``cursor=``) gives the
        next page."""
        return _reply(request, _calls.outcomes_page(b, q))

    @app.get("/v1/events", tags=["events"])
    def events(request: Request, b: B, q: Annotated[EventListQuery, Query()]) -> Response:
        """Events with ``seq > after`` (or after ``cursor``, not both; neither: from the
        start) in commit order, one page of ``limit``; ``next_cursor`` gives the next page
        (``null``: no event follows). Filters: ``kind``; ``resource_type``
        with ``resource_id`` (the events of that resource's leases: ``lease.*``,
        ``fence.rejected``, and ``handoff.*`` of handoffs carrying one); ``subject`` (the
        events with exactly this subject)."""
        return _reply(request, _calls.events_page(b, q))
