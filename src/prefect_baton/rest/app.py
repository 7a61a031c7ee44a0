"""The REST API: :func:`create_app` builds a FastAPI app over the ledger (and optionally
Redis as the lease authority), with the seed service's routes under ``/v1``.

Every ``/v1`` request carries ``Authorization: Bearer bk_...`` (see
:mod:`prefect_baton.rest.keys`); the key decides org, principal and role. Responses:

* success: ``{"data": ..., "meta": {"request_id": "req_...", "replayed": bool}}``;
* error: ``{"error": {"code": ..., "message": ...}}`` (+ ``expires_at`` on a lease
  ``CONFLICT``, ``current_version``/``expected_version`` on ``VERSION_CONFLICT``).

Fixed statuses: ``400 VALIDATION_ERROR`` (bad values, malformed JSON, wrong types, unknown
fields: FastAPI's 422 is replaced), ``401 UNAUTHENTICATED`` (no, unknown or revoked key),
``403 FORBIDDEN`` (role or missing scope), ``404 NOT_FOUND`` (also another org's ids),
``409`` for ``CONFLICT``, ``VERSION_CONFLICT``, ``IDEMPOTENCY_MISMATCH``,
``IDEMPOTENCY_IN_FLIGHT``, ``LEASE_LOST`` and ``STALE_FENCE`` (all say: the state the request
presumed no longer holds; the code tells them apart), ``413 PAYLOAD_TOO_LARGE`` (body over
2 MiB, :data:`~prefect_baton.rest._http.MAX_BODY_BYTES`), ``503 UNAVAILABLE``.

``Idempotency-Key`` is honoured (passed as ``idempotency_key``, with the receipt semantics
of DESIGN.md; a replay gives ``meta.replayed = true``) on every mutating route: acquire
(single and batch), release (``DELETE /v1/leases/{id}`` and ``POST .../release``), renew,
transfer, force-release, handoff create and resolve, checkpoint save and outcome record.
A request under a key still in flight is ``409 IDEMPOTENCY_IN_FLIGHT``. Only
``POST /v1/leases/report-expired`` (which records events, not a transition) refuses the
header with ``400`` rather than silently ignoring it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import OperationalError
from sqlmodel import Session
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.routing import Match

from .. import _core
from .._authority import Caller
from .._backend import open_backend
from .._client import Baton
from .._ledger.tables import ApiKeyRow
from ..errors import BatonError, NotFoundError, UnavailableError, ValidationError
from ..models import Lease
from . import _schemas as s
from ._http import BatonMiddleware, baton_error_response, error_response, ok
from ._openapi import install_openapi
from .keys import KeyCache

__all__ = ["create_app"]

IdemKey = Annotated[str | None, Header(alias="Idempotency-Key")]


def _strip(value: Any) -> Any:
    """``value`` without the ``replayed`` flags of models (``meta.replayed`` carries it)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "replayed"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _utf8(key: str | None) -> str | None:
    """The ``Idempotency-Key`` header as sent: its bytes read as UTF-8 (Starlette hands
    header values over as Latin-1), so keys outside ASCII work as in Python.

    Raises:
        ValidationError: the bytes are not UTF-8 (read as Latin-1 instead, two different
            keys could become one).
    """
    if key is None:
        return None
    try:
        return key.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise ValidationError("Idempotency-Key must be UTF-8 text") from None


def _no_idempotency_key(key: IdemKey = None) -> None:
    """Refuse ``Idempotency-Key`` on routes whose operation keeps no receipt (yet)."""
    if key is not None:
        raise ValidationError("Idempotency-Key is not supported on this route")


NoKey = [Depends(_no_idempotency_key)]

#: The execution key of a lease proof: an id (1 to 256 characters, no control characters),
#: as every execution key the Python API accepts; a malformed one is 400, not LEASE_LOST.
ExecutionKey = s.Id
#: A fencing token presented with ``fence_lease_id``: 0 to 2**53 - 1, as a version is (and
#: as the MCP tools' ``epoch``); out of range is 400, not STALE_FENCE.
Epoch = s.Version


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


class BatchItemIn(BaseModel):
    """One resource of ``POST /v1/leases/batch``; unset fields take the call's defaults."""

    model_config = ConfigDict(extra="forbid", strict=True)

    resource_type: s.Id
    resource_id: s.Id
    ttl_seconds: s.Ttl | None = None
    purpose: s.Text | None = None
    scopes: s.Scopes | None = None
    expected_version: s.Version | None = None


class BatchIn(BaseModel):
    """``POST /v1/leases/batch``: acquire every resource or none (1..1,000)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    resources: Annotated[list[BatchItemIn], Field(min_length=1, max_length=1000)]
    ttl_seconds: s.Ttl
    purpose: s.Text | None = None
    scopes: s.Scopes = []


class HandoffProofIn(s.HandoffIn):
    """``POST /v1/handoffs``; ``lease_execution_key`` is the execution key presented with
    ``lease_id`` (absent: the lease's own)."""

    lease_execution_key: ExecutionKey | None = None


class FencedCheckpointIn(s.CheckpointIn):
    """``PUT /v1/checkpoints``; ``fence_epoch`` is the epoch the writer presents with
    ``fence_lease_id`` (default: that lease's own)."""

    fence_epoch: Epoch | None = None


class FencedOutcomeIn(s.OutcomeIn):
    """``POST /v1/outcomes``; ``fence_epoch`` as for checkpoints."""

    fence_epoch: Epoch | None = None


def _proof_lease(b: Baton, lease_id: str, body: BaseModel) -> Lease:
    """The caller's lease ``lease_id`` with the execution key of the presented proof."""
    lease = b.leases.get(lease_id)
    if "execution_key" in body.model_fields_set:
        lease = lease.model_copy(update={"execution_key": getattr(body, "execution_key", None)})
    return lease


def _fence(b: Baton, lease_id: str | None, epoch: int | None) -> Lease | None:
    """The lease presented as a fence: the caller's lease ``lease_id`` at ``epoch``.

    Raises:
        StaleFenceError: the lease is unknown, another principal's or another org's (as
            the Python API refuses such a fence).
    """
    if lease_id is None:
        return None
    try:
        lease = b.leases.get(lease_id)
    except NotFoundError:
        lease = None
    if lease is None or lease.owner != b.principal:
        _core.check_fence(None, lease_id=lease_id, epoch=epoch or 0, now_ms=0)
    assert lease is not None
    if epoch is not None and epoch != lease.epoch:
        lease = lease.model_copy(update={"epoch": epoch})
    return lease


def _dump(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return _strip(obj.model_dump(mode="json"))
    if isinstance(obj, list):
        return [_dump(o) for o in obj]
    return obj


def _rid(request: Request) -> str:
    return str(request.state.request_id)


def _reply(request: Request, obj: Any, *, status: int = 200, key: str = "") -> JSONResponse:
    data = {key: _dump(obj)} if key else _dump(obj)
    return ok(data, _rid(request), replayed=bool(getattr(obj, "replayed", False)), status=status)


def _baton(request: Request) -> Baton:
    caller: Caller = request.state.caller
    state = request.app.state
    return Baton(
        org=caller.org,
        principal=caller.principal,
        role=caller.role,
        settings=state.settings,
        store=state.store,
        lease_authority=state.authority,
    )


B = Annotated[Baton, Depends(_baton)]


def _allowed_methods(request: Request) -> str:
    """The methods of the path template ``request`` falls under in the OpenAPI document (a
    literal path before a templated one), for a 405's Allow."""
    routes = request.app.router.routes
    matching = [r for r in routes if r.matches(request.scope)[0] is not Match.NONE]
    literal = [r for r in matching if getattr(r, "path", None) == request.url.path]
    path = getattr((literal or matching or [None])[0], "path", None)
    methods: set[str] = set()
    for route in routes:
        if path is not None and getattr(route, "path", None) == path:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        msg = s.PATTERN_MESSAGES.get(str(err.get("ctx", {}).get("pattern")), err.get("msg"))
        parts.append(f"{loc or 'body'}: {msg or 'invalid'}")
    return "; ".join(parts) or "invalid request"


def create_app(ledger_url: str | None = None, redis_url: str | None = None) -> FastAPI:
    """Build the REST API app.

    Args:
        ledger_url: SQLAlchemy URL of the ledger (``str``; default ``BATON_LEDGER_URL``);
            migrated on start, and holding the bearer keys.
        redis_url: Redis URL of the lease authority (``str``; default ``BATON_REDIS_URL``;
            neither set: the ledger is the authority). ``BATON_REDIS_ACK`` and
            ``BATON_REDIS_POST_LOSS`` apply to it.

    Bearer keys looked up are cached for ``BATON_KEY_CACHE_SECONDS`` (see
    :class:`~prefect_baton.rest.keys.KeyCache`; ``app.state.key_cache``).

    Returns:
        A :class:`fastapi.FastAPI` app; ``app.state.store`` is its
        :class:`~prefect_baton._ledger.store.LedgerStore`. Shutting the app down closes it.

    Raises:
        ValidationError: a malformed URL or a bad ``BATON_*`` variable (nothing is opened
            then). UnavailableError: the ledger cannot be reached.
    """
    backend = open_backend(ledger_url, redis_url)
    settings, store, authority = backend.settings, backend.store, backend.authority

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        backend.close()

    app = FastAPI(title="prefect-baton", version="1", lifespan=lifespan)
    app.state.store = store
    app.state.settings = settings
    app.state.authority = authority
    app.state.key_cache = KeyCache(settings.key_cache_seconds)
    app.add_middleware(
        BatonMiddleware, engines=lambda: store.engines, key_cache=app.state.key_cache
    )

    @app.exception_handler(BatonError)
    async def _on_baton(_r: Request, exc: BatonError) -> Response:
        return baton_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(_r: Request, exc: RequestValidationError) -> Response:
        return error_response("VALIDATION_ERROR", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(_r: Request, exc: StarletteHTTPException) -> Response:
        codes = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 400: "VALIDATION_ERROR"}
        code = codes.get(exc.status_code, "INTERNAL")
        resp = error_response(code, str(exc.detail), status=exc.status_code)
        resp.headers.update(exc.headers or {})
        if exc.status_code == 405:  # Allow lists every route of the path (RFC 9110)
            resp.headers["Allow"] = _allowed_methods(_r)
        return resp

    @app.exception_handler(Exception)
    async def _on_other(_r: Request, _exc: Exception) -> Response:
        return error_response("INTERNAL", "internal error")

    def held(b: Baton, lease_id: str | None) -> Lease | None:
        return None if lease_id is None else b.leases.get(lease_id)

    # ------------------------------------------------------------------ leases

    @app.post("/v1/leases", status_code=201, tags=["leases"])
    def acquire(request: Request, body: s.AcquireIn, b: B, key: IdemKey = None) -> Response:
        """Acquire a lease; 409 CONFLICT (expiry only) while another holds it."""
        lease = b.leases.acquire(
            body.resource_type,
            body.resource_id,
            ttl_seconds=body.ttl_seconds,
            purpose=body.purpose,
            scopes=body.scopes,
            expected_version=body.expected_version,
            idempotency_key=_utf8(key),
        )
        return _reply(request, lease, status=201)

    @app.get("/v1/leases", tags=["leases"])
    def list_leases(
        request: Request,
        b: B,
        resource_type: str | None = None,
        owner: str | None = None,
        include_ended: bool = False,
        limit: Annotated[int, Query()] = 100,
    ) -> Response:
        """Your effective leases (``owner`` needs owner/admin), newest first."""
        leases = b.leases.list(
            resource_type=resource_type, owner=owner, include_ended=include_ended, limit=limit
        )
        return _reply(request, leases, key="leases")

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
        data = {
            "lease_id": receipt.lease.lease_id,
            "released_at": _dump(receipt.lease).get("released_at"),
            "status": receipt.status,
            "lease": _dump(receipt.lease),
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
        renewed = b.leases.renew(
            lease,
            ttl_seconds=body.ttl_seconds,
            expected_version=body.expected_version,
            idempotency_key=_utf8(key),
        )
        return _reply(request, renewed)

    @app.post("/v1/leases/{lease_id}/transfer", tags=["leases"])
    def transfer(
        request: Request, lease_id: str, body: TransferProofIn, b: B, key: IdemKey = None
    ) -> Response:
        """Hand a lease you hold to another principal; returns the receiver's lease."""
        lease = _proof_lease(b, lease_id, body)
        moved = b.leases.transfer(
            lease,
            to_principal=body.to_principal,
            new_execution_key=body.new_execution_key,
            ttl_seconds=body.ttl_seconds,
            expected_version=body.expected_version,
            idempotency_key=_utf8(key),
        )
        return _reply(request, moved)

    @app.post("/v1/leases/{lease_id}/release", tags=["leases"])
    def release_by_proof(
        request: Request, lease_id: str, b: B, body: ReleaseIn | None = None, key: IdemKey = None
    ) -> Response:
        """Release a lease you hold by proof (id, you, execution key): ``released``,
        ``expired`` (it had run out) or ``no_change`` (already released by this proof);
        409 LEASE_LOST once another holder has it."""
        body = body or ReleaseIn()
        receipt = b.leases.release(
            _proof_lease(b, lease_id, body),
            expected_version=body.expected_version,
            idempotency_key=_utf8(key),
        )
        return _reply(request, receipt)

    @app.post("/v1/leases/batch", status_code=201, tags=["leases"])
    def acquire_many(request: Request, body: BatchIn, b: B, key: IdemKey = None) -> Response:
        """Acquire several resources all-or-nothing; the first refusal's error otherwise
        (nothing acquired). ``data.replayed`` flags each lease that came back replayed."""
        items = [item.model_dump(exclude_none=True) for item in body.resources]
        leases = b.leases.acquire_many(
            items,
            ttl_seconds=body.ttl_seconds,
            purpose=body.purpose,
            scopes=body.scopes,
            idempotency_key=_utf8(key),
        )
        data = {"leases": _dump(leases), "replayed": [lease.replayed for lease in leases]}
        replayed = bool(leases) and all(lease.replayed for lease in leases)
        return ok(data, _rid(request), replayed=replayed, status=201)

    @app.post("/v1/leases/report-expired", tags=["leases"], dependencies=NoKey)
    def report_expired(request: Request, b: B, limit: int = 1000) -> Response:
        """Record ``lease.expired`` once per lapsed lease of the org; the leases reported."""
        return _reply(request, b.leases.report_expired(limit=limit), key="leases")

    @app.get("/v1/leases/{lease_id}", tags=["leases"])
    def get_lease(request: Request, lease_id: str, b: B) -> Response:
        """A lease generation by id (yours; any of the org's for owner/admin)."""
        return _reply(request, b.leases.get(lease_id))

    @app.post("/v1/leases/{lease_id}/force-release", tags=["leases"])
    def force_release(request: Request, lease_id: str, b: B, key: IdemKey = None) -> Response:
        """Release anyone's lease of the org (owner/admin); 403 for an agent."""
        receipt = b.leases.force_release(lease_id, idempotency_key=_utf8(key))
        return _reply(request, receipt)

    # ------------------------------------------------------------------ handoffs

    @app.post("/v1/handoffs", status_code=201, tags=["handoffs"])
    def create_handoff(
        request: Request, body: HandoffProofIn, b: B, key: IdemKey = None
    ) -> Response:
        """Create a pending handoff addressed to ``to_principal``."""
        lease = held(b, body.lease_id)
        if lease is not None and "lease_execution_key" in body.model_fields_set:
            lease = lease.model_copy(update={"execution_key": body.lease_execution_key})
        handoff = b.handoffs.create(
            body.to_principal,
            body.subject_id,
            checkpoint_id=body.checkpoint_id,
            context_id=body.context_id,
            message=body.message,
            lease=lease,
            idempotency_key=_utf8(key),
            expires_in_seconds=body.expires_in_seconds,
        )
        return _reply(request, handoff, status=201)

    @app.get("/v1/handoffs", tags=["handoffs"])
    def inbox(request: Request, b: B, limit: int = 100) -> Response:
        """Pending handoffs addressed to the caller."""
        return _reply(request, b.handoffs.inbox(limit=limit), key="handoffs")

    @app.get("/v1/handoffs/{handoff_id}", tags=["handoffs"])
    def show_handoff(request: Request, handoff_id: str, b: B) -> Response:
        """A handoff you sent or received."""
        return _reply(request, b.handoffs.get(handoff_id))

    @app.post("/v1/handoffs/{handoff_id}/resolve", tags=["handoffs"])
    def resolve(
        request: Request, handoff_id: str, body: s.ResolveIn, b: B, key: IdemKey = None
    ) -> Response:
        """Accept or reject a pending handoff addressed to you; a second resolve is 404."""
        handoff = b.handoffs.resolve(
            handoff_id,
            body.status,
            body.note,
            execution_key=body.execution_key,
            ttl_seconds=body.ttl_seconds,
            idempotency_key=_utf8(key),
        )
        return _reply(request, handoff)

    # ------------------------------------------------------------------ checkpoints

    @app.put("/v1/checkpoints", tags=["checkpoints"])
    def save(request: Request, body: FencedCheckpointIn, b: B, key: IdemKey = None) -> Response:
        """Write your checkpoint of ``(subject_id, kind)``; version +1 per write."""
        ck = b.checkpoints.save(
            body.subject_id,
            body.kind,
            body.state,
            expected_version=body.expected_version,
            fence=_fence(b, body.fence_lease_id, body.fence_epoch),
            idempotency_key=_utf8(key),
            ttl_seconds=body.ttl_seconds,
        )
        return _reply(request, ck)

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
    def history(
        request: Request, b: B, subject_id: str, kind: str, principal: str | None = None
    ) -> Response:
        """Every version of a checkpoint, oldest first."""
        versions = b.checkpoints.history(subject_id, kind, principal)
        return _reply(request, versions, key="checkpoints")

    @app.get("/v1/checkpoints/{checkpoint_id}", tags=["checkpoints"])
    def get_checkpoint_by_id(request: Request, checkpoint_id: str, b: B) -> Response:
        """A checkpoint of the org by id (e.g. the one attached to a handoff)."""
        return _reply(request, b.checkpoints.get_by_id(checkpoint_id))

    # ------------------------------------------------------------------ outcomes, events

    @app.post("/v1/outcomes", status_code=201, tags=["outcomes"])
    def record(request: Request, body: FencedOutcomeIn, b: B, key: IdemKey = None) -> Response:
        """Record ``succeeded``, ``failed`` or ``cancelled`` for a subject."""
        outcome = b.outcomes.record(
            body.subject_id,
            body.status,
            evidence=[e.model_dump() for e in body.evidence],
            fence=_fence(b, body.fence_lease_id, body.fence_epoch),
            lease_id=body.lease_id,
            handoff_id=body.handoff_id,
            checkpoint_id=body.checkpoint_id,
            idempotency_key=_utf8(key),
        )
        return _reply(request, outcome, status=201)

    @app.get("/v1/outcomes", tags=["outcomes"])
    def outcomes(
        request: Request, b: B, subject_id: str | None = None, limit: int = 1000
    ) -> Response:
        """Outcomes of the org, of one subject when given."""
        return _reply(request, b.outcomes.list(subject_id, limit=limit), key="outcomes")

    @app.get("/v1/events", tags=["events"])
    def events(
        request: Request, b: B, after: int = 0, limit: int = 100, kind: str | None = None
    ) -> Response:
        """Events with ``seq > after`` in commit order."""
        return _reply(request, b.events.list(after, limit, kind), key="events")

    # ------------------------------------------------------------------ identity

    @app.get("/v1/me", tags=["identity"])
    def me(request: Request) -> Response:
        """The identity of the bearer key: ``org``, ``principal``, ``role``, ``scopes``,
        ``key_id``, and the server's checkpoint ``state_max_bytes``. Needs no scope."""
        caller: Caller = request.state.caller
        key_id: str = request.state.key_id
        try:
            with Session(store.engines.read) as session:
                row = session.get(ApiKeyRow, key_id)
        except OperationalError as exc:
            raise UnavailableError("ledger database unavailable") from exc
        data = {
            "org": caller.org,
            "principal": caller.principal,
            "role": caller.role,
            "scopes": json.loads(row.scopes) if row is not None else [],
            "key_id": key_id,
            "state_max_bytes": store.state_max_bytes,
        }
        return ok(data, _rid(request))

    install_openapi(app)
    return app
