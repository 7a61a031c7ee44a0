"""MCP over streamable HTTP (stateless): the REST API's bearer keys, host check and body
limits, and the reading rule of :mod:`._envelope` (the one of MCP over stdio) before the
``mcp`` package reads a message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prefect_baton._client.sync import Baton
from prefect_baton._rules.validation import request_body_limit, request_container_limit
from prefect_baton._settings import BatonSettings
from prefect_baton._stores.factory import open_stores
from prefect_baton._stores.ledger.engine import Engines
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.protocol import LeaseAuthority
from prefect_baton.errors import (
    ForbiddenError,
    UnavailableError,
)
from prefect_baton.mcp._envelope import Dropped, Refusal, read_bytes
from prefect_baton.mcp._server import Identity, build_server
from prefect_baton.mcp._tools import (
    Grant,
)
from prefect_baton.rest._body import BodyCut, is_json, receive_body, replaying
from prefect_baton.rest._http import (
    BatonMiddleware,
    baton_error_response,
    check_host,
    new_request_id,
)
from prefect_baton.rest._json_body import run_for_body

__all__ = ["http_app", "serve_http"]


class _KeyVerifier:
    """The ``mcp`` package's token-verifier hook over the REST API's bearer keys: a key
    that is unknown or revoked is refused (HTTP 401) before any tool runs."""

    def __init__(self, engines: Callable[[], Engines]) -> None:
        self._engines = engines

    async def verify_token(self, token: str) -> AccessToken | None:
        from prefect_baton.rest.keys import authenticate

        key = await anyio.to_thread.run_sync(authenticate, self._engines(), token)
        if key is None:
            return None
        # The secret itself is not kept: ``token`` holds the key's public id.
        return AccessToken(
            token=key.key_id,
            client_id=key.key_id,
            scopes=list(key.scopes),
            subject=key.principal,
            claims={"org": key.org, "principal": key.principal, "role": key.role},
        )


class _ScreenedMessages:
    """ASGI middleware in front of the ``mcp`` package's endpoint (:func:`_screen_endpoint`):
    a JSON body of a request with a valid key that
    :func:`~prefect_baton.mcp._envelope.read_bytes` refuses, as it refuses a stdin line
    (not text, not JSON: ``-32700`` with ``id`` null; a key named twice, a request id that
    is not a string or an integer, ``params`` that are not an object, an object that is not
    a JSON-RPC message: ``-32600`` or ``-32602``), is answered ``400`` with that JSON-RPC
    error before the package sees it (it would take a request with a bad id for a
    notification and answer ``202`` with nothing, and put pydantic's whole report in the
    message of the others); a notification it refuses is answered ``202`` with no body
    (JSON-RPC answers no notification) and logged, and the package never sees it. A body
    over :data:`~prefect_baton.rest._json_body.THREAD_PARSE_BYTES` is read on a worker thread.
    Runs after :class:`~prefect_baton.rest._http.BatonMiddleware`, which has already
    refused (``413``) a body over the size limit or holding too many objects and arrays,
    and parses none (``parse_json=False``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        screened = scope["type"] == "http" and scope.get("method") == "POST" and is_json(scope)
        # A request without a valid key is left to the package's bearer check (401).
        if not screened or not isinstance(scope.get("user"), AuthenticatedUser):
            await self.app(scope, receive, send)
            return
        try:
            body = await receive_body(receive) or b""  # no limit: never None
        except BodyCut:  # the client went away before the body's end: nothing runs
            return
        answer = await run_for_body(_screened_body, body)
        if isinstance(answer, Dropped):  # a notification: never answered, but accepted
            await Response(status_code=202)(scope, receive, send)
            return
        if answer is not None:
            text = answer.model_dump_json(by_alias=True, exclude_unset=True)
            await Response(text, status_code=400, media_type="application/json")(
                scope, receive, send
            )
            return
        await self.app(scope, replaying(body, receive), send)


def _screen_endpoint(app: Starlette, path: str = "/mcp") -> None:
    """Put :class:`_ScreenedMessages` in front of the endpoint at ``path`` of ``app``:
    after the ``mcp`` package's authentication middleware, which tells it whether the
    request carries a valid key (one without is left to the package's ``401``)."""
    for route in app.routes:
        if isinstance(route, Route) and route.path == path:
            route.app = _ScreenedMessages(route.app)
            return
    raise RuntimeError(f"the mcp package's app has no route {path}")


def _screened_body(body: bytes) -> Refusal | Dropped | None:
    """The JSON-RPC error (:class:`Refusal`) answering an HTTP ``body`` (``bytes``, UTF-8
    JSON) by
    :func:`~prefect_baton.mcp._envelope.read_bytes`, or :class:`Dropped` (a refused
    notification, answered by nothing), else ``None`` (no body, or a message to serve, a
    JSON-RPC error response of the client among them)."""
    answer = read_bytes(body)
    return answer if isinstance(answer, (Refusal, Dropped)) else None


class _UnavailableAs503:
    """ASGI middleware: a ledger that cannot be reached while a key is checked gives
    ``503 {"error": {"code": "UNAVAILABLE", ...}}`` instead of a bare 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except UnavailableError as exc:
            if started or scope["type"] != "http":
                raise
            rid = scope.get("state", {}).get("request_id") or new_request_id()
            await baton_error_response(exc, rid)(scope, receive, send)


def _key_identity(
    store: LedgerStore, authority: LeaseAuthority, settings: BatonSettings
) -> Identity:
    def identity(ctx: ServerRequestContext[Any, Any]) -> tuple[Baton, Grant | None]:
        scope = getattr(ctx.request, "scope", None)
        user = scope.get("user") if isinstance(scope, dict) else None
        if not isinstance(user, AuthenticatedUser):
            raise ForbiddenError("this request carries no authenticated key")
        token = user.access_token
        claims = token.claims or {}
        baton = Baton(
            org=str(claims["org"]),
            principal=str(claims["principal"]),
            role=str(claims["role"]),
            settings=settings,
            store=store,
            lease_authority=authority,
        )
        return baton, Grant(scopes=frozenset(token.scopes), key_id=token.token)

    return identity


def _issuer(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def http_app(
    ledger_url: str | None = None,
    redis_url: str | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8788,
) -> Starlette:
    """The streamable HTTP app (endpoint ``/mcp``), authenticated by bearer keys.

    Each request's ``Authorization: Bearer bk_...`` key (see
    :func:`prefect_baton.rest.keys.create_key`) decides the org, principal and role of the
    tool calls it carries; a tool needs the key's scope of its area (``leases:write`` for
    ``baton_lease_acquire``, ``handoffs:read`` for ``baton_handoff_inbox``, ...), else it is a
    ``FORBIDDEN`` tool error. A missing, unknown or revoked key is answered ``401`` before
    any tool runs; a ledger that cannot be reached then, ``503``. Keys are accepted only in
    the ``Authorization`` header: a key in the URL is ``401``, two ``Authorization`` headers
    are ``400``, and a body over the REST API's limits (the larger of 2 MiB and 3 times the
    checkpoint state cap + 64 KiB, :func:`~prefect_baton._rules.validation.request_body_limit`
    of the store's ``state_max_bytes``; more JSON objects and arrays than
    :func:`~prefect_baton._rules.validation.request_container_limit`) is ``413`` (as the
    REST API, through its :class:`~prefect_baton.rest._http.BatonMiddleware`). A body with
    a valid key that is not a JSON-RPC message (not JSON, a key named twice, ...) gets
    ``400`` and the JSON-RPC error stdio gives the same line, or ``202`` and no body when it
    is a notification. Keys are never logged. No MCP
    session is kept (the ``mcp`` package's stateless mode): each request stands alone, so
    clients leave no state behind.

    Args:
        ledger_url: SQLAlchemy URL of the ledger (``str``; default ``BATON_LEDGER_URL``),
            holding the keys.
        redis_url: Redis URL of the lease authority (``str``; default none: the ledger).
        host, port: where it will be served (``str``, ``int``); a loopback host turns on
            the ``mcp`` package's DNS-rebinding protection (``Host``/``Origin`` checks).

    Returns:
        A Starlette app; its lifespan runs the MCP session manager and closes the ledger
        (and the Redis authority) on shutdown.

    Raises:
        ValidationError: a malformed ledger or Redis URL, or a ``host`` that is neither a
            host name nor an IP address. UnavailableError: the ledger cannot be reached.
    """
    check_host(host)
    auth = AuthSettings(issuer_url=_issuer(host, port), resource_server_url=None)
    stores = open_stores(ledger_url, redis_url)
    settings, store, authority = stores.settings, stores.ledger, stores.authority
    close = stores.close

    server = build_server(_key_identity(store, authority, settings), on_close=close)
    limit = request_body_limit(store.state_max_bytes)
    app = server.streamable_http_app(
        host=host,
        auth=auth,
        token_verifier=_KeyVerifier(lambda: store.engines),
        # Every call acts as its own request's key, so no session state is kept: no
        # session id, nothing to expire or cap, no memory held between requests.
        stateless_http=True,
        max_request_body_size=limit,  # the mcp package's own cap (4 MiB) would cut ours
    )
    _screen_endpoint(app)
    app.router.redirect_slashes = False  # /mcp/ is 404, not a redirect to the client's Host
    app.add_middleware(_UnavailableAs503)
    # Outermost: request ids, one Authorization header, no key in the URL, the body caps;
    # the body is read by _ScreenedMessages, whose refusals are JSON-RPC errors.
    app.add_middleware(
        BatonMiddleware,
        engines=lambda: store.engines,
        max_body_bytes=limit,
        max_containers=request_container_limit(store.state_max_bytes),
        parse_json=False,
        head_as_get=False,
    )
    return app


def serve_http(
    host: str = "127.0.0.1",
    port: int = 8788,
    ledger_url: str | None = None,
    redis_url: str | None = None,
) -> None:
    """Serve :func:`http_app` until interrupted (SIGINT/SIGTERM), with the REST API's
    uvicorn set-up (:func:`prefect_baton.rest.__main__.run_app`: bearer keys redacted from
    the log).

    Args:
        host: interface to bind (``str``, default loopback). port: TCP port (``int``).
        ledger_url, redis_url: as :func:`http_app`.

    Raises:
        ValidationError: a malformed URL. UnavailableError: the ledger cannot be reached.
        SystemExit: uvicorn could not bind ``host:port`` (code 1, reason in the log).
    """
    from prefect_baton.rest.__main__ import run_app

    run_app(http_app(ledger_url, redis_url, host=host, port=port), host, port)
