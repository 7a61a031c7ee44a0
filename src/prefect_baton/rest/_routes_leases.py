"""The lease routes of the REST API (``/v1/leases...``) and their request bodies,
registered on the app by :func:`add_routes`."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import FastAPI, Query, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from prefect_baton.errors import NotFoundError
from prefect_baton.rest import _calls, _fastpath
from prefect_baton.rest import _schemas as s
from prefect_baton.rest._deps import (
    B,
    ExecutionKey,
    IdemKey,
    Limit,
    NoKey,
    _dump,
    _proof_lease,
    _reply,
    _rid,
    _utf8,
)
from prefect_baton.rest._http import ok

log = logging.getLogger("prefect_baton.rest")


class LeaseListQuery(BaseModel):
    """The query of ``GET /v1/leases``: its filters and page (the client checks them)."""

    resource_type: str | None = None
    owner: str | None = None
    include_ended: bool = False
    limit: Limit = 100
    cursor: str | None = None


class _ProofIn(BaseModel):
    """The execution key of a lease proof. Absent: the lease's own (the seed service's
    behaviour); present (``null`` included): exactly the key the Python client presents."""

    model_config = ConfigDict(extra="forbid", strict=True)

    execution_key: ExecutionKey | None = None


class RenewProofIn(s.RenewIn):
    """``POST /v1/leases/{id}/renew``, optionally with the proof's ``execution_key``."""

    execution_key: ExecutionKey | None = None


class TransferProofIn(s.TransferIn):
    """``POST /v1/leases/{id}/transfer``, optionally with the proof's ``execution_key``."""

    execution_key: ExecutionKey | None = None


class ReleaseIn(_ProofIn):
    """``POST /v1/leases/{id}/release``: release by proof (``no_change`` on a repeat)."""

    expected_version: s.Version | None = None


def add_routes(app: FastAPI) -> None:
    """Register the lease routes on ``app`` (called once by
    :func:`~prefect_baton.rest.app.create_app`)."""

    @app.post("/v1/leases", status_code=201, tags=["leases"])
    def acquire(request: Request, body: s.AcquireIn, b: B, key: IdemKey = None) -> Response:
        """Acquire a lease; 409 CONFLICT (expiry only) while another holds it."""
        lease = _calls.acquire(b, body, _utf8(key), body.attempt)
        return _reply(request, lease, status=201)

    @app.get("/v1/leases", tags=["leases"])
    def list_leases(request: Request, b: B, q: Annotated[LeaseListQuery, Query()]) -> Response:
        """Your effective leases (``owner`` needs owner/admin), newest first, one page of
        ``limit``; ``next_cursor`` (as ``cursor=``) gives the next page."""
        return _reply(request, _calls.leases_page(b, q))

    @app.get("/v1/leases/inspect", tags=["leases"])
    def inspect(request: Request, b: B, resource_type: str, resource_id: str) -> Response:
        """Whether a resource is held, until when; holder details only for the holder."""
        return _reply(request, b.leases.inspect(resource_type, resource_id))

    @app.delete("/v1/leases/{lease_id}", tags=["leases"])
    def release(request: Request, lease_id: str, b: B, key: IdemKey = None) -> Response:
        """Release by id as its holder; 404 when released, unknown or not yours."""
        receipt = b.leases.release_by_id(lease_id, idempotency_key=_utf8(key))
        if receipt.status == "no_change":
            raise NotFoundError("no active lease with that id")
        lease = _dump(receipt.lease)
        data = {
            "lease_id": receipt.lease.lease_id,
            "released_at": lease.get("released_at"),
            "status": receipt.status,
            "lease": lease,
        }
        return ok(data, _rid(request), replayed=receipt.replayed)

    @app.post("/v1/leases/{lease_id}/renew", tags=["leases"])
    def renew(
        request: Request,
        lease_id: str,
        b: B,
        body: RenewProofIn | None = None,
        key: IdemKey = None,
    ) -> Response:
        """Extend a lease you hold; 409 LEASE_LOST once it has ended or expired."""
        body = body or RenewProofIn()
        lease = _proof_lease(b, lease_id, body)
        return _reply(request, _calls.renew(b, lease, body, _utf8(key)))

    @app.post("/v1/leases/{lease_id}/transfer", tags=["leases"])
    def transfer(
        request: Request, lease_id: str, body: TransferProofIn, b: B, key: IdemKey = None
    ) -> Response:
        """Hand a lease you hold to another principal; returns the receiver's lease."""
        lease = _proof_lease(b, lease_id, body)
        return _reply(request, _calls.transfer(b, lease, body, _utf8(key)))

    @app.post("/v1/leases/{lease_id}/release", tags=["leases"])
    def release_by_proof(
        request: Request, lease_id: str, b: B, body: ReleaseIn | None = None, key: IdemKey = None
    ) -> Response:
        """Release a lease you hold by proof (id, you, execution key): ``released``,
        ``expired`` (it had run out) or ``no_change`` (already released by this proof);
        409 LEASE_LOST once another holder has it."""
        body = body or ReleaseIn()
        lease = _proof_lease(b, lease_id, body)
        return _reply(request, _calls.release(b, lease, body.expected_version, _utf8(key)))

    @app.post("/v1/leases/batch", status_code=201, tags=["leases"])
    def acquire_many(request: Request, body: s.BatchIn, b: B, key: IdemKey = None) -> Response:
        """Acquire several resources all-or-nothing; the first refusal's error otherwise
        (nothing acquired). ``data.replayed`` flags each lease that came back replayed."""
        leases = _calls.acquire_many(b, body, _utf8(key), body.attempt)
        data = {"leases": _dump(leases), "replayed": [lease.replayed for lease in leases]}
        replayed = bool(leases) and all(lease.replayed for lease in leases)
        return ok(data, _rid(request), replayed=replayed, status=201)

    @app.post("/v1/leases/report-expired", tags=["leases"], dependencies=NoKey)
    def report_expired(request: Request, b: B, limit: Limit = 1000) -> Response:
        """Record ``lease.expired`` once per lapsed lease of the org; the leases reported."""
        return _reply(request, b.leases.report_expired(limit=limit), key="leases")

    @app.get("/v1/leases/{lease_id}", tags=["leases"])
    def get_lease(request: Request, lease_id: str, b: B) -> Response:
        """A lease generation by id (yours; any of the org's for owner/admin)."""
        return _reply(request, b.leases.get(lease_id))

    @app.post("/v1/leases/{lease_id}/force-release", tags=["leases"])
    def force_release(request: Request, lease_id: str, b: B, key: IdemKey = None) -> Response:
        """Release anyone's lease of the org (owner/admin; the receipt says ``forced:
        true``); 403 for an agent."""
        return _reply(request, _calls.force_release(b, lease_id, _utf8(key)))

    # The two requests of every lease's life go the shorter way through FastAPI. The fast
    # path reads FastAPI's route internals; a FastAPI whose internals differ keeps its own
    # handler for the route (same answers, more work per request) instead of failing to start.
    for route in app.router.routes:
        if isinstance(route, APIRoute) and route.endpoint in (acquire, release):
            try:
                _fastpath.install(route)
            except (TypeError, AttributeError) as exc:
                log.warning("no fast path for %s: %s", route.path, exc)
