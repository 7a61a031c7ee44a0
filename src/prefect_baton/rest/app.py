"""The REST API: :func:`create_app` builds a FastAPI app over the ledger (and optionally
Redis as the lease authority), with the seed service's routes under ``/v1``.

Every ``/v1`` request carries ``Authorization: Bearer bk_...`` (see
:mod:`prefect_baton.rest.keys`); the key decides org, principal and role. Responses:

* success: ``{"data": ..., "meta": {"request_id": "req_...", "replayed": bool}}``;
* error: ``{"error": {"code": ..., "message": ...}, "meta": {"request_id": "req_..."}}``
  (+ ``expires_at`` on a lease ``CONFLICT``, ``current_version``/``expected_version`` on
  ``VERSION_CONFLICT``, ``status`` on ``LEASE_LOST`` when the lease's end is known).

Fixed statuses: ``400 VALIDATION_ERROR`` (bad values, malformed JSON, wrong types, unknown
fields: FastAPI's 422 is replaced), ``401 UNAUTHENTICATED`` (no, unknown or revoked key),
``403 FORBIDDEN`` (role or missing scope), ``404 NOT_FOUND`` (also another org's ids),
``409`` for ``CONFLICT``, ``VERSION_CONFLICT``, ``IDEMPOTENCY_MISMATCH``,
``IDEMPOTENCY_IN_FLIGHT``, ``LEASE_LOST`` and ``STALE_FENCE`` (all say: the state the request
presumed no longer holds; the code tells them apart), ``413 PAYLOAD_TOO_LARGE`` (body over
the larger of 2 MiB and 3 times the checkpoint state cap + 64 KiB, 3,211,264 bytes by default:
:func:`~prefect_baton._rules.validation.request_body_limit`, or holding more JSON objects and
arrays than :func:`~prefect_baton._rules.validation.request_container_limit`, 557,056 by
default), ``503 UNAVAILABLE`` and ``500
INTERNAL`` (whose message names only the request id: the detail, e.g. a database driver's
error, stays in the server log, see :func:`~prefect_baton.rest._http.client_error`).

``Idempotency-Key`` is honoured (passed as ``idempotency_key``, with the receipt semantics
of DESIGN.md; a replay gives ``meta.replayed = true``) on every mutating route: acquire
(single and batch), release (``DELETE /v1/leases/{id}`` and ``POST .../release``), renew,
transfer, force-release, handoff create and resolve, checkpoint save and outcome record.
A request under a key still in flight is ``409 IDEMPOTENCY_IN_FLIGHT``. Only
``POST /v1/leases/report-expired`` (which records events, not a transition) refuses the
header with ``400`` rather than silently ignoring it.

The routes are defined by area in :mod:`prefect_baton.rest._routes_leases` and
:mod:`prefect_baton.rest._routes_records` (shared request plumbing in
:mod:`prefect_baton.rest._deps`); :func:`create_app` registers them on the app, then
``/v1/me`` and ``/v1/reconciler/lag``, ``/metrics`` (authenticated like ``/v1``) and the
live page at ``/ui`` (:mod:`prefect_baton.rest._ui`); neither of the last two is in the
OpenAPI document.
"""

from __future__ import annotations

import difflib
import json
import logging
from collections.abc import AsyncIterator, Callable, Collection, Coroutine
from contextlib import asynccontextmanager
from functools import cached_property
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError
from sqlmodel import Session
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from prefect_baton import metrics
from prefect_baton._rules.validation import request_body_limit, request_container_limit
from prefect_baton._stores.factory import open_stores
from prefect_baton._stores.ledger.engine import ledger_failure
from prefect_baton._stores.ledger.tables import ApiKeyRow
from prefect_baton._stores.protocol import Caller
from prefect_baton.errors import BatonError, as_baton_error, from_pydantic
from prefect_baton.rest import _calls, _routes_leases, _routes_records, _ui
from prefect_baton.rest import _schemas as s
from prefect_baton.rest._body import has_body, replaying
from prefect_baton.rest._deps import B, _reply, _rid
from prefect_baton.rest._http import (
    JSON_BODY_STATE,
    BatonMiddleware,
    baton_error_response,
    error_response,
    logger,
)
from prefect_baton.rest._json_body import quoted
from prefect_baton.rest._openapi import install_openapi
from prefect_baton.rest.keys import KeyCache

log = logging.getLogger("prefect_baton.rest")

__all__ = ["create_app"]


def _allowed_methods(request: Request) -> str:
    """The methods the path of ``request`` is served with, for a 405's ``Allow`` (RFC 9110
    section 10.2.1): those of every route whose path matches it, as the router tries them
    all, so a method is listed exactly when it is not answered ``405``. A literal path may
    also match a templated one (``/v1/leases/batch``: ``POST`` there, and ``GET`` and
    ``DELETE`` of ``/v1/leases/{lease_id}``, which answer ``404`` for a lease ``batch``);
    ``HEAD`` wherever ``GET`` is."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if route.matches(request.scope)[0] is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    if "GET" in methods:  # answered as GET without the body (BatonMiddleware)
        methods.add("HEAD")
    return ", ".join(sorted(methods))


class _ParsedRequest(Request):
    """A request whose JSON body :class:`~prefect_baton.rest._http.BatonMiddleware` has
    parsed already: :meth:`json` gives that ``document`` instead of parsing the body again
    (on the event loop, where FastAPI reads it)."""

    def __init__(self, scope: Scope, receive: Receive, document: Any) -> None:
        super().__init__(scope, receive)
        self._document = document

    async def json(self) -> Any:
        """The body's JSON document, as the middleware read it."""
        return self._document


def _query_names(dependant: Dependant) -> frozenset[str]:
    """The query parameters a route declares (``dependant``: its FastAPI dependant, with
    those of its dependencies; a pydantic model read from the query gives its fields)."""
    names: set[str] = set()
    todo = [dependant]
    while todo:
        d = todo.pop()
        todo.extend(d.dependencies)
        for field in d.query_params:
            model = field.field_info.annotation
            if isinstance(model, type) and issubclass(model, BaseModel):
                names.update(f.alias or n for n, f in model.model_fields.items())
            else:
                names.add(field.alias)
    return frozenset(names)


def unknown_query_parameter(query: bytes, known: Collection[str]) -> str | None:
    """The refusal of the first parameter of the raw query string ``query`` that is not
    in ``known`` (the route's names), naming the closest known one when one is close,
    else ``None``: a misspelt filter (``resource_typ=``) would otherwise be ignored and the
    answer silently wider than asked."""
    for name, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1)
        if close:
            hint = f"did you mean {quoted(close[0])}?"
        elif known:
            hint = "this route takes " + ", ".join(quoted(k) for k in sorted(known))
        else:
            hint = "this route takes none"
        return f"unknown query parameter {quoted(name)} ({hint})"
    return None


class _ParsedBodyRoute(APIRoute):
    """The route class of the app: a request with a method the route takes (any other is
    ``405``) naming a query parameter the route does not
    declare (:func:`unknown_query_parameter`), or carrying a body where the route takes
    none, is ``400 VALIDATION_ERROR``, before anything
    else of the route runs (its fast path too); its handler reads a JSON body from the
    document the middleware parsed (``scope["state"]["json_body"]``, taken from there)
    rather than parsing the body a second time on the event loop, which would hold up
    every other request of the process for as long as a large body takes."""

    @cached_property
    def query_names(self) -> frozenset[str]:
        """The query parameters the route declares (:func:`_query_names`)."""
        return _query_names(self.dependant)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse an unknown query parameter, or a body sent to a route that takes none,
        else handle the request as FastAPI does. A method the route does not take is
        answered ``405`` first (by Starlette, whatever the query or the body): the request
        reaches no route, so what it sends along does not matter."""
        if self.methods and scope.get("method") not in self.methods:
            await super().handle(scope, receive, send)
            return
        query = bytes(scope.get("query_string", b""))
        refused = unknown_query_parameter(query, self.query_names) if query else None
        if refused is None and self.body_field is None and has_body(scope):
            # its fields (an execution key, a fence, a filter) would be ignored, and the
            # request served as if unconditional
            refused = (
                f"{scope.get('method', '')} {self.path} takes no request body (its "
                "parameters go in the path, the query or headers)"
            )
        if refused is not None:
            await error_response("VALIDATION_ERROR", refused)(scope, receive, send)
            return
        await super().handle(scope, receive, send)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parsed_once(request: Request) -> Response:
            state = request.scope.get("state", {})
            if JSON_BODY_STATE in state:
                document = state.pop(JSON_BODY_STATE)
                body = await request.body()  # read already when the fast path fell back
                receive = replaying(body, request.receive)
                request = _ParsedRequest(request.scope, receive, document)
            return await handler(request)

        return parsed_once


def create_app(ledger_url: str | None = None, redis_url: str | None = None) -> FastAPI:
    """Build the REST API app.

    Args:
        ledger_url: SQLAlchemy URL of the ledger (``str``; default ``BATON_LEDGER_URL``);
            migrated on start, and holding the bearer keys.
        redis_url: Redis URL of the lease authority (``str``; default ``BATON_REDIS_URL``;
            neither set: the ledger is the authority). ``BATON_REDIS_ACK`` and
            ``BATON_REDIS_POST_LOSS`` apply to it.

    A request body may be at most
    :func:`~prefect_baton._rules.validation.request_body_limit` of the store's
    ``state_max_bytes`` (``BATON_STATE_MAX_BYTES``) bytes, and hold at most
    :func:`~prefect_baton._rules.validation.request_container_limit` of it JSON objects and
    arrays, else ``413``.

    Bearer keys looked up are cached for ``BATON_KEY_CACHE_SECONDS`` (see
    :class:`~prefect_baton.rest.keys.KeyCache`; ``app.state.key_cache``). Building the app
    enables metrics recording in the process (:func:`prefect_baton.metrics.enable`);
    ``GET /metrics`` shows the caller's organization's.

    Returns:
        A :class:`fastapi.FastAPI` app; ``app.state.store`` is its
        :class:`~prefect_baton._stores.ledger.store.LedgerStore`. Shutting the app down closes it.

    Raises:
        ValidationError: a malformed URL or a bad ``BATON_*`` variable (nothing is opened
            then). UnavailableError: the ledger cannot be reached.
    """
    stores = open_stores(ledger_url, redis_url)
    settings, store, authority = stores.settings, stores.ledger, stores.authority
    metrics.enable()  # counted where decided: by the clients this app runs for its callers

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        stores.close()

    # No redirect of /v1/leases/ to /v1/leases: a 307 to the Host the client sent, with an
    # empty body; a path with a trailing slash is 404 NOT_FOUND like any unknown path.
    # The document and its pages are routes of the app's route class (install_openapi).
    app = FastAPI(
        title="prefect-baton",
        version="1",
        lifespan=lifespan,
        redirect_slashes=False,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.router.route_class = _ParsedBodyRoute
    app.state.store = store
    app.state.close_stores = stores.close  # for a server that builds the app only to check
    app.state.settings = settings
    app.state.authority = authority
    app.state.key_cache = KeyCache(settings.key_cache_seconds)
    app.state.batons = {}  # the Baton of each caller, see _deps._baton
    body_limit = request_body_limit(store.state_max_bytes)
    app.add_middleware(
        BatonMiddleware,
        engines=lambda: store.engines,
        max_body_bytes=body_limit,
        key_cache=app.state.key_cache,
        max_containers=request_container_limit(store.state_max_bytes),
        router=app.router,
    )

    @app.exception_handler(BatonError)
    async def _on_baton(_r: Request, exc: BatonError) -> Response:
        return baton_error_response(exc, _rid(_r))

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(_r: Request, exc: RequestValidationError) -> Response:
        if isinstance(exc.body, bytes):  # a body FastAPI did not read as JSON: say why
            sent = _r.headers.get("content-type", "").split(";")[0].strip()[:100]
            got = f"Content-Type: {sent}" if sent else "no Content-Type"
            return error_response(
                "VALIDATION_ERROR",
                f"body: the body must be JSON with Content-Type: application/json (got {got})",
            )
        # a body field reads "field: ...", a query parameter "name: ..." (its location's
        # "query." left out, as "body." is), as the client's own checks name them
        err = from_pydantic(exc, skip={"body", "query"}, root="body", messages=s.PATTERN_MESSAGES)
        return error_response(err.code, err.message)

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(_r: Request, exc: StarletteHTTPException) -> Response:
        codes = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 400: "VALIDATION_ERROR"}
        code = codes.get(exc.status_code, "INTERNAL_ERROR")
        resp = error_response(code, str(exc.detail), status=exc.status_code)
        resp.headers.update(exc.headers or {})
        if exc.status_code == 405:  # Allow lists every route of the path (RFC 9110)
            resp.headers["Allow"] = _allowed_methods(_r)
        return resp

    @app.exception_handler(Exception)
    async def _on_other(_r: Request, exc: Exception) -> Response:
        # answered outside the middleware: the request id comes from the request's state
        rid = _rid(_r)
        logger.error("request %s failed", rid, exc_info=exc)
        resp = baton_error_response(as_baton_error(exc), rid)
        resp.headers["x-request-id"] = rid  # as on every other answer
        return resp

    _routes_leases.add_routes(app)
    _routes_records.add_routes(app)

    # ------------------------------------------------------------------ identity

    @app.get("/v1/me", tags=["identity"])
    def me(request: Request, b: B) -> Response:
        """The identity of the bearer key: ``org``, ``principal``, ``role``, ``scopes``,
        ``key_id``, and the server's checkpoint ``state_max_bytes``. Needs no scope."""
        key_id: str = request.state.key_id
        try:
            with Session(store.engines.read) as session:
                row = session.get(ApiKeyRow, key_id)
        except OperationalError as exc:
            raise ledger_failure(store.engines, exc) from exc
        scopes = json.loads(row.scopes) if row is not None else []
        return _reply(request, _calls.me(b, scopes, key_id))

    # ------------------------------------------------------------------ metrics

    @app.get("/metrics", include_in_schema=False)
    def metrics_exposition(request: Request) -> Response:
        """The Prometheus text exposition of this server's metrics (see
        :mod:`prefect_baton.metrics`), only the caller's organization's samples: counters
        and histograms of its operations, and its gauges (effective leases, pending
        handoffs, reconciler lag) computed now. Any valid key may read it (no scope)."""
        from prometheus_client import CONTENT_TYPE_LATEST

        from prefect_baton.metrics._prom import exposition

        caller: Caller = request.state.caller
        body = exposition(store, authority, caller.org)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/reconciler/lag", tags=["identity"])
    def lag(request: Request, b: B) -> Response:
        """How far the ledger is behind the lease authority for the caller's org:
        ``authority`` (``ledger``: the ledger is the authority, nothing lags; ``redis``:
        ``entries`` journal entries not yet applied, the oldest ``seconds`` old). Needs no
        scope. 503 UNAVAILABLE when Redis cannot be reached; 403 FORBIDDEN when this server
        has no Redis URL and Redis decides the org's leases."""
        return _reply(request, _calls.reconciler_lag(b, authority, store))

    _ui.add_routes(app)
    install_openapi(app, body_limit)
    return app
