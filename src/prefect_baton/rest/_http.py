"""Envelopes, error statuses and the ASGI middleware (body limit, bearer auth, request id).

Every error body is ``{"error": {"code": ..., "message": ...}, "meta": {"request_id":
...}}``: the seed service's error envelope, the error's own fields (``expires_at`` of a
lease conflict, ``current_version``/``expected_version`` of a version conflict, ``status``
of a lost lease when known), and the request id of the ``X-Request-ID`` header as a success
body carries it. The HTTP status of each code is fixed by :data:`STATUS_BY_CODE`.
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes

import anyio.to_thread
from starlette.responses import JSONResponse
from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prefect_baton._rules.access import check_scope
from prefect_baton._rules.validation import (
    DEFAULT_STATE_MAX_BYTES,
    request_body_limit,
    request_container_limit,
)
from prefect_baton._stores.ledger.engine import Engines
from prefect_baton._stores.protocol import Caller
from prefect_baton.errors import BatonError, ForbiddenError, ValidationError
from prefect_baton.rest._body import (
    BodyCut,
    content_length,
    has_body,
    is_json,
    receive_body,
    replaying,
)
from prefect_baton.rest._json_body import (
    parse_json_body,
    quoted,
    run_for_body,
    too_many_containers,
)
from prefect_baton.rest.keys import AREAS, KEY_PREFIX, ApiKey, KeyCache, authenticate

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_BODY_CONTAINERS",
    "STATUS_BY_CODE",
    "BatonMiddleware",
    "check_host",
    "client_error",
    "error_response",
    "new_request_id",
    "ok",
]

logger = logging.getLogger("prefect_baton.rest")


def check_host(host: str) -> None:
    """Check ``host`` (``str``), the interface ``baton serve`` or ``baton mcp --transport
    http`` is to bind, before anything is opened or looked up: it must make a valid
    ``http://`` URL host (a host name or an IPv4/IPv6 address), as the URL the MCP server
    advertises needs. The one host check of both servers.

    Raises:
        ValidationError: ``bad host ... (--host)``: not a host name or an IP address.
    """
    from pydantic import AnyHttpUrl, TypeAdapter
    from pydantic import ValidationError as PydanticValidationError

    url = f"http://[{host}]/" if ":" in host else f"http://{host}/"
    try:
        TypeAdapter(AnyHttpUrl).validate_python(url)
    except PydanticValidationError:
        raise ValidationError(
            f"bad host {host!r} (--host): not a host name or an IP address"
        ) from None


#: Largest request body a server with the default checkpoint state cap (1 MiB) accepts, in
#: bytes (3 MiB + 64 KiB = 3,211,264); a larger one gets ``413``. A server's own limit
#: follows its ``state_max_bytes`` (``BATON_STATE_MAX_BYTES``):
#: :func:`~prefect_baton._rules.validation.request_body_limit`, never below 2 MiB. The REST
#: API and the MCP server over HTTP share it.
MAX_BODY_BYTES = request_body_limit(DEFAULT_STATE_MAX_BYTES)
#: Most JSON objects and arrays a request body of a server with the default checkpoint
#: state cap may hold (557,056); a body with more gets ``413``. A server's own limit
#: follows its ``state_max_bytes``:
#: :func:`~prefect_baton._rules.validation.request_container_limit`. The REST API and the
#: MCP server over HTTP share it.
MAX_BODY_CONTAINERS = request_container_limit(DEFAULT_STATE_MAX_BYTES)

#: A bearer key's secret as it appears in a URL (percent-decoded): ``bk_`` and 43 URL-safe
#: characters (:func:`~prefect_baton.rest.keys.create_key`).
_KEY_IN_URL = re.compile(re.escape(KEY_PREFIX).encode() + rb"[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")

#: Codes whose message may carry server detail (driver errors name hosts, ports, roles,
#: databases): clients get a generic message naming the request id; the log keeps it.
_SERVER_SIDE_CODES = frozenset({"UNAVAILABLE", "INTERNAL_ERROR"})

#: HTTP status of every error code. Conflicts of every kind, idempotency clashes and the
#: lease-state codes ``LEASE_LOST`` and ``STALE_FENCE`` are all ``409``: the request was
#: well formed and authorised, but the state it presumed no longer holds.
STATUS_BY_CODE: dict[str, int] = {
    "VALIDATION_ERROR": 400,
    "UNAUTHENTICATED": 401,
    "FORBIDDEN": 403,
    "NOT_FOUND": 404,
    "METHOD_NOT_ALLOWED": 405,
    "CONFLICT": 409,
    "VERSION_CONFLICT": 409,
    "IDEMPOTENCY_MISMATCH": 409,
    "IDEMPOTENCY_IN_FLIGHT": 409,
    "LEASE_LOST": 409,
    "STALE_FENCE": 409,
    "PAYLOAD_TOO_LARGE": 413,
    "INTERNAL_ERROR": 500,
    "UNAVAILABLE": 503,
}


#: The id of the request being answered (set by :class:`BatonMiddleware` in the request's
#: task, so every error envelope built while answering it carries the id).
_REQUEST_ID: ContextVar[str | None] = ContextVar("baton_request_id", default=None)


def error_response(
    code: str,
    message: str,
    *,
    extra: Mapping[str, Any] | None = None,
    status: int | None = None,
    request_id: str | None = None,
) -> JSONResponse:
    """The error envelope for ``code`` (``str``) and ``message`` (``str``), with the status
    of :data:`STATUS_BY_CODE` (500 for an unknown code) unless ``status`` is given, and
    ``meta.request_id``: ``request_id``, else the id of the request being answered (none
    outside a request)."""
    body: dict[str, Any] = {"code": code, "message": message}
    if extra:
        body.update(extra)
    envelope: dict[str, Any] = {"error": body}
    rid = request_id or _REQUEST_ID.get()
    if rid is not None:
        envelope["meta"] = {"request_id": rid}
    headers = {"WWW-Authenticate": "Bearer"} if code == "UNAUTHENTICATED" else None
    return JSONResponse(
        envelope,
        status_code=status or STATUS_BY_CODE.get(code, 500),
        headers=headers,
    )


def client_error(exc: BatonError, request_id: str) -> dict[str, Any]:
    """What a client of the REST API or the MCP server is told of ``exc``
    (:class:`~prefect_baton.errors.BatonError`): its ``to_dict()``, except that the message
    of an ``UNAVAILABLE`` or ``INTERNAL_ERROR`` error (which may name a database's host, port,
    role or name) is replaced by a generic one naming ``request_id`` (``str``): ``the service
    is unavailable; retry later (request …)`` or ``internal error (request …)`` (a bug, which
    a retry does not cure); the detail is logged (logger ``prefect_baton.rest``, with the
    request id)."""
    d = exc.to_dict()
    if exc.code in _SERVER_SIDE_CODES:
        logger.warning("%s for request %s: %s", exc.code, request_id, exc.message)
        if exc.code == "UNAVAILABLE":
            d["message"] = f"the service is unavailable; retry later (request {request_id})"
        else:
            d["message"] = f"internal error (request {request_id})"
    return d


def baton_error_response(exc: BatonError, request_id: str | None = None) -> JSONResponse:
    """The error envelope of a :class:`~prefect_baton.errors.BatonError` for a client
    (:func:`client_error`) of the request ``request_id`` (``str``; by default the current
    request's, or a new id when the app is not behind :class:`BatonMiddleware`)."""
    d = client_error(exc, request_id or _REQUEST_ID.get() or new_request_id())
    code = str(d.pop("code"))
    message = str(d.pop("message"))
    return error_response(code, message, extra=d)


def ok(data: Any, request_id: str, *, replayed: bool = False, status: int = 200) -> JSONResponse:
    """The success envelope ``{"data": data, "meta": {"request_id", "replayed"}}``."""
    return JSONResponse(
        {"data": data, "meta": {"request_id": request_id, "replayed": replayed}},
        status_code=status,
    )


# Request ids: 128 bits from a PRNG of this module, seeded from the OS at import and again
# in a forked child. An id to correlate, not a secret: no entropy syscall per request.
_request_ids = random.Random()
os.register_at_fork(after_in_child=_request_ids.seed)


def new_request_id() -> str:
    """A new request id, ``req_`` and 32 hex digits."""
    return f"req_{_request_ids.getrandbits(128):032x}"


#: The key of ``scope["state"]`` under which :class:`BatonMiddleware` leaves the JSON
#: document of a request's body it has parsed (absent when it parsed none).
JSON_BODY_STATE = "json_body"


def _repeated_parameter(query: bytes) -> str | None:
    """The first query parameter named more than once in ``query`` (the raw query
    string), else ``None``. No parameter of the API takes several values, and which of
    two counts would be a guess (FastAPI keeps the last one)."""
    seen: set[str] = set()
    for name, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if name in seen:
            return name
        seen.add(name)
    return None


def _refused_head(scope: Scope) -> JSONResponse | None:
    """The answer to a request whose head is refused before anything else, else ``None``:
    more than one ``Authorization`` or ``Idempotency-Key`` header (``400``: which one
    counts would be a guess),
    a query parameter given more than once (``400``, likewise), a path or query whose
    percent-escapes do not decode to UTF-8 (``400``: read leniently, ``%FF`` and ``%FE``
    would both name the id ``\ufffd``), or a bearer key in the URL's path or query (``401``:
    keys are accepted only in the ``Authorization`` header; the access log redacts it)."""
    headers = scope.get("headers", [])
    for single in ("Authorization", "Idempotency-Key"):
        lowered = single.lower().encode()
        if sum(1 for name, _ in headers if name.lower() == lowered) > 1:
            return error_response("VALIDATION_ERROR", f"send one {single} header, not several")
    repeated = _repeated_parameter(bytes(scope.get("query_string", b"")))
    if repeated is not None:
        return error_response(
            "VALIDATION_ERROR", f"query parameter {quoted(repeated)} is given more than once"
        )
    target = bytes(scope.get("raw_path") or scope.get("path", "").encode()) + b"?"
    target += bytes(scope.get("query_string", b""))
    decoded = unquote_to_bytes(target.replace(b"+", b" "))
    try:
        decoded.decode("utf-8")
    except UnicodeDecodeError as exc:
        return error_response(
            "VALIDATION_ERROR",
            f"the URL is not UTF-8 once percent-decoded (byte {exc.start} of the decoded "
            "path and query)",
        )
    if _KEY_IN_URL.search(decoded):
        return error_response(
            "UNAUTHENTICATED", "a bearer key is accepted only in the Authorization header"
        )
    return None


def _coded_body(scope: Scope) -> JSONResponse | None:
    """The answer to a request whose body carries a ``Content-Encoding`` other than
    ``identity`` (``415 VALIDATION_ERROR``: the server decodes no content coding, and
    reading a gzip body as plain JSON would misread it, or accept plain JSON mislabelled as
    encoded), else ``None``. A request without a body (:func:`has_body`) has nothing the
    header could describe, and is not refused for it."""
    headers = scope.get("headers", [])
    codings = [v for name, v in headers if name.lower() == b"content-encoding"]
    if not any(c.strip().lower() not in (b"", b"identity") for c in codings):
        return None
    if not has_body(scope):
        return None
    sent = ", ".join(c.decode("latin-1").strip() for c in codings)[:100]
    return error_response(
        "VALIDATION_ERROR",
        f"Content-Encoding {quoted(sent)} is not supported: send the body unencoded "
        "(no Content-Encoding, or identity)",
        status=415,
    )


class _TooManyContainers(Exception):
    """A request body holds more JSON objects and arrays than the server's limit."""


#: The path of the authenticated metrics exposition (any valid key may read it).
METRICS_PATH = "/metrics"


def _area(path: str) -> str | None:
    parts = path.split("/")
    if len(parts) >= 3 and parts[1] == "v1" and parts[2] in AREAS:
        return parts[2]
    return None


class BatonMiddleware:
    """ASGI middleware in front of every route.

    * gives each request an id (``scope["state"]["request_id"]``, header ``X-Request-ID``);
    * with ``head_as_get`` (the REST API): answers ``HEAD`` as ``GET`` without the body
      (the ``GET`` answer's status and headers), on every path;
    * refuses more than one ``Authorization`` or ``Idempotency-Key`` header and a query
      parameter given more than once (``400``), and a bearer key in the URL (``401``; keys
      are accepted only in the ``Authorization`` header);
    * under ``/v1`` and at ``/metrics``: authenticates the bearer key (``401`` when
      missing, unknown or revoked) and checks the route's scope (``<area>:read`` for ``GET``, else
      ``<area>:write``; ``403`` when missing), before the body is parsed; the caller is
      put in ``scope["state"]["caller"]`` and the key's scopes in ``["scopes"]``. A key
      found in ``key_cache`` is answered on the
      event loop; otherwise the ledger is asked on a worker thread and a valid key is
      cached (see :class:`~prefect_baton.rest.keys.KeyCache` for when a revocation
      applies);
    * refuses a body with a ``Content-Encoding`` other than ``identity``
      (:func:`_coded_body`: ``415 VALIDATION_ERROR``; a request without a body is not
      refused for the header);
    * runs nothing for a request whose body never ends (the client closes the connection,
      or the server closes it at its body deadline, before the body's last byte): the app
      is not called and nothing is answered (:func:`receive_body`);
    * refuses bodies over ``max_body_bytes`` with ``413`` (by ``Content-Length`` or by
      counting a streamed body) before any route runs;
    * refuses a JSON body (a JSON ``Content-Type``: what FastAPI reads as JSON) holding
      more than ``max_containers`` objects and arrays (:func:`too_many_containers`) with
      ``413 PAYLOAD_TOO_LARGE``, before it is parsed;
    * with ``parse_json`` (the REST API): refuses a JSON body that
      :func:`parse_json_body` refuses (malformed, a key twice in one object, ...)
      with ``400 VALIDATION_ERROR``, before any route runs. The document is left in
      ``scope["state"]["json_body"]`` (:data:`JSON_BODY_STATE`), where the routes of
      :func:`~prefect_baton.rest.create_app` read it instead of parsing the body again.
      Without it (the MCP server over HTTP, which answers a body it cannot read with a
      JSON-RPC error) the body is passed on unparsed.

    A body over :data:`THREAD_PARSE_BYTES` is counted and parsed on a worker thread
    (:func:`run_for_body`), so other requests are answered meanwhile.

    The order of the checks: the head's (above), the key and its scope, then, given a
    ``router``, the route: a request with a body that no route of ``router`` serves with its
    method (:meth:`_routed`) is answered by the app (``404`` or ``405``) at once, its body
    left unread, rather than refused for its body or kept waiting for it; then the body's
    (``415``, ``413``, ``400``). An answer given while a body the request announces
    (:func:`has_body`) is left unread carries ``Connection: close``: the connection is
    closed after it rather than held until the rest of the body arrives.

    Args:
        app: the wrapped ASGI app. engines: callable returning the ledger's engines (keys).
        max_body_bytes: the body limit (``int``, bytes; default :data:`MAX_BODY_BYTES`, the
            default state cap's; servers pass
            :func:`~prefect_baton._rules.validation.request_body_limit` of their store's
            ``state_max_bytes``).
        key_cache: the cache of looked-up keys (:class:`~prefect_baton.rest.keys.KeyCache`;
            default: none, every request asks the ledger).
        max_containers: the limit on objects and arrays (``int``; default
            :data:`MAX_BODY_CONTAINERS`, the default state cap's; servers pass
            :func:`~prefect_baton._rules.validation.request_container_limit` of their
            store's ``state_max_bytes``).
        parse_json: whether JSON bodies are parsed and refused here (``bool``, default
            ``True``).
        head_as_get: whether ``HEAD`` is answered as ``GET`` without the body (``bool``,
            default ``True``; the MCP server over HTTP passes ``False``: a ``GET`` of its
            endpoint is a stream, not a document).
        router: the app's router (:class:`starlette.routing.Router`), whose routes decide
            whether a request reaches a route before its body is refused; default none:
            every request is taken to reach one.
    """

    def __init__(
        self,
        app: ASGIApp,
        engines: Callable[[], Engines],
        max_body_bytes: int = MAX_BODY_BYTES,
        key_cache: KeyCache | None = None,
        max_containers: int = MAX_BODY_CONTAINERS,
        parse_json: bool = True,
        head_as_get: bool = True,
        router: Router | None = None,
    ) -> None:
        self.app = app
        self.engines = engines
        self.max_body_bytes = max_body_bytes
        self.key_cache = key_cache or KeyCache(0)
        self.max_containers = max_containers
        self.parse_json = parse_json
        self.head_as_get = head_as_get
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        _REQUEST_ID.set(request_id)  # this request's task (one per request)
        state = scope.setdefault("state", {})
        state["request_id"] = request_id

        head = self.head_as_get and scope.get("method") == "HEAD"
        if head:  # answered as GET, without the body (a new scope: the server's stays HEAD)
            scope = {**scope, "method": "GET"}

        # A body left unread (the request is answered before it is read, or was cut short)
        # would hold the connection until it arrives: the answer closes it.
        unread = has_body(scope)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                if unread and all(name.lower() != b"connection" for name, _ in headers):
                    headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
            elif head and message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        refused = _refused_head(scope)
        if refused is not None:
            await refused(scope, receive, send_with_id)
            return
        path: str = scope.get("path", "")
        method: str = scope.get("method", "GET")
        if path == "/v1" or path.startswith("/v1/") or path == METRICS_PATH:
            denied = await self._authorize(scope, state, path, method)
            if denied is not None:
                await denied(scope, receive, send_with_id)
                return
        if unread and not self._routed(scope):  # 404 or 405 at once, whatever the body
            await self.app(scope, receive, send_with_id)
            return
        coded = _coded_body(scope)
        if coded is not None:
            await coded(scope, receive, send_with_id)
            return
        try:
            body = await self._read_body(scope, receive)
        except BodyCut:  # the body never ended: nothing runs, and no one is left to answer
            return
        if body is None:
            resp = error_response(
                "PAYLOAD_TOO_LARGE",
                f"request body is over the limit of {self.max_body_bytes} bytes",
            )
            await resp(scope, receive, send_with_id)
            return
        unread = False
        if body and is_json(scope):
            try:
                doc = await run_for_body(self._read_json, body)
            except _TooManyContainers:
                resp = error_response(
                    "PAYLOAD_TOO_LARGE",
                    f"request body holds more than {self.max_containers} JSON objects and "
                    "arrays (the limit of this server)",
                )
                await resp(scope, replaying(body, receive), send_with_id)
                return
            except ValidationError as exc:
                resp = baton_error_response(exc, request_id)
                await resp(scope, replaying(body, receive), send_with_id)
                return
            if self.parse_json:
                state[JSON_BODY_STATE] = doc
        await self.app(scope, replaying(body, receive), send_with_id)

    def _routed(self, scope: Scope) -> bool:
        """Whether a route of :attr:`router` serves this request's path with its method
        (always, without a router). Otherwise the app answers it ``404`` (no route has the
        path) or ``405`` (none takes the method), whatever its body."""
        if self.router is None:
            return True
        return any(route.matches(scope)[0] is Match.FULL for route in self.router.routes)

    def _read_json(self, body: bytes) -> Any:
        """The document of the JSON ``body`` (``bytes``) when :attr:`parse_json`, else
        ``None``, once it is found to hold no more than :attr:`max_containers` objects and
        arrays.

        Raises:
            _TooManyContainers: it holds more. ValidationError: as :func:`parse_json_body`.
        """
        if too_many_containers(body, self.max_containers):
            raise _TooManyContainers
        return parse_json_body(body) if self.parse_json else None

    async def _authorize(
        self, scope: Scope, state: dict[str, Any], path: str, method: str
    ) -> JSONResponse | None:
        headers = dict(scope.get("headers", []))
        raw = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, secret = raw.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return error_response("UNAUTHENTICATED", "a bearer key is required")
        secret = secret.strip()
        key: ApiKey | None = self.key_cache.get(secret)
        if key is None:
            token = self.key_cache.start()
            try:
                key = await anyio.to_thread.run_sync(authenticate, self.engines(), secret)
            except BatonError as exc:
                return baton_error_response(exc, state["request_id"])
            self.key_cache.put(secret, key, token)
        if key is None:
            return error_response("UNAUTHENTICATED", "the bearer key is unknown or revoked")
        area = _area(path)
        if area is not None:
            need = f"{area}:{'read' if method in ('GET', 'HEAD') else 'write'}"
            try:
                check_scope(key.scopes, need)
            except ForbiddenError as exc:
                return error_response(exc.code, exc.message)
        state["caller"] = Caller(org=key.org, principal=key.principal, role=key.role)
        state["key_id"] = key.key_id
        state["scopes"] = key.scopes
        return None

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The request's whole body, or ``None`` when its ``Content-Length`` or what
        arrives is over :attr:`max_body_bytes` (:func:`receive_body`).

        Raises:
            BodyCut: the client went away before the body's end.
        """
        headers = dict(scope.get("headers", []))
        length = headers.get(b"content-length")
        if length is not None:
            announced = content_length(length)
            if announced is None or announced > self.max_body_bytes:
                return None
        return await receive_body(receive, self.max_body_bytes)
