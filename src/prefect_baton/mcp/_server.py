"""The MCP server: the tools of :mod:`._tools` on the ``mcp`` package's low-level
:class:`~mcp.server.lowlevel.Server`, served over stdio or streamable HTTP.

The low-level server is used rather than :class:`~mcp.server.MCPServer` because the latter
derives each tool's argument model from a function signature, and that model ignores
unknown fields; here each tool's ``inputSchema`` is its pydantic model's JSON schema
(``additionalProperties: false``) and the same model validates the call.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, cast

import anyio
import anyio.to_thread
import mcp.types as types
import pydantic
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared._stream_protocols import WriteStream
from mcp.shared.message import SessionMessage
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prefect_baton import __version__
from prefect_baton._client.sync import Baton
from prefect_baton._rules.validation import request_body_limit
from prefect_baton._settings import BatonSettings
from prefect_baton._stores.factory import open_stores
from prefect_baton._stores.ledger.engine import Engines
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.protocol import LeaseAuthority
from prefect_baton.errors import (
    BatonError,
    ForbiddenError,
    UnavailableError,
    as_baton_error,
    from_pydantic,
)
from prefect_baton.mcp._tools import (
    SEED_ALIASES,
    TOOLS,
    Grant,
    SeedAlias,
    ToolSpec,
    resolve_tool,
)
from prefect_baton.rest import _schemas as rest_schemas
from prefect_baton.rest._http import (
    BatonMiddleware,
    DuplicateKey,
    baton_error_response,
    check_host,
    client_error,
    new_request_id,
    unique_keys,
)

__all__ = ["Identity", "build_server", "http_app", "serve_http", "serve_stdio", "tool_error"]

logger = logging.getLogger("prefect_baton.mcp")

#: ``identity(ctx) -> (baton, grant)``: the client acting for one tool call and what its
#: bearer key grants (:class:`~prefect_baton.mcp.Grant`), or ``None`` (every tool, no
#: key, as over stdio). Called on a worker thread.
Identity = Callable[[ServerRequestContext[Any, Any]], tuple[Baton, Grant | None]]

_TRUSTED = Grant(scopes=None, key_id=None)

SERVER_NAME = "prefect-baton"
INSTRUCTIONS = (
    "Coordination for agents sharing work: claim a resource with baton_lease_acquire before "
    "destructive work, save progress with baton_checkpoint_save (fenced by lease_id + epoch), "
    "pass unfinished work with baton_handoff_create, and record the result with evidence "
    "with baton_outcome_record. Errors are tool errors whose text is "
    '{"error": {"code": ..., "message": ...}}.'
)


def _text_result(body: dict[str, Any], *, is_error: bool) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(body))],
        structured_content=body,
        is_error=is_error,
    )


def tool_error(error: dict[str, Any]) -> types.CallToolResult:
    """A tool error (``isError: true``) carrying ``{"error": error}`` as JSON text and as
    structured content; ``error`` has ``code`` and ``message`` (plus the error's fields,
    e.g. ``expires_at`` of a lease ``CONFLICT``)."""
    return _text_result({"error": error}, is_error=True)


def _tool(spec: ToolSpec, alias: SeedAlias | None = None) -> types.Tool:
    """The listing of ``spec``, or of its seed ``alias`` (the seed's name and argument
    names, the same output)."""
    if alias is None:
        name, description = spec.name, spec.description
        input_schema = spec.model.model_json_schema()
    else:
        name, input_schema = alias.name, alias.input_schema()
        description = f"The seed service's name of {spec.name}. {spec.description}"
    return types.Tool(
        name=name,
        description=description,
        input_schema=input_schema,
        output_schema=spec.output.model_json_schema(mode="serialization"),
        annotations=types.ToolAnnotations(
            read_only_hint=spec.read_only,
            destructive_hint=False,
            open_world_hint=False,
        ),
    )


def _call(
    identity: Identity, ctx: ServerRequestContext[Any, Any], spec: ToolSpec, args: Any
) -> Any:
    baton, granted = identity(ctx)
    grant = _TRUSTED if granted is None else granted
    scopes = grant.scopes
    if scopes is not None and spec.scope is not None and spec.scope not in scopes:
        raise ForbiddenError(f"this key lacks the scope {spec.scope}")
    if spec.with_grant:
        return spec.run(baton, args, grant)
    return spec.run(baton, args)


def _request_id(ctx: ServerRequestContext[Any, Any]) -> str:
    """The id of the HTTP request carrying a tool call (set by
    :class:`~prefect_baton.rest._http.BatonMiddleware`), or a new one (stdio)."""
    scope = getattr(ctx.request, "scope", None)
    state = scope.get("state") if isinstance(scope, dict) else None
    rid = state.get("request_id") if isinstance(state, dict) else None
    return rid if isinstance(rid, str) else new_request_id()


def build_server(identity: Identity, *, on_close: Callable[[], None] | None = None) -> Server[Any]:
    """The MCP server with every tool of :data:`~prefect_baton.mcp.TOOLS`.

    Args:
        identity: gives the :class:`~prefect_baton.Baton` acting for a call and its
            :class:`~prefect_baton.mcp.Grant` (scopes, key id; ``None``: all scopes, no
            key), see :data:`Identity`.
        on_close: called once when the server's lifespan ends (e.g. to close the ledger).

    Returns:
        A :class:`mcp.server.lowlevel.Server`. A call with unknown or badly typed arguments
        is a tool error with ``VALIDATION_ERROR`` and writes nothing; a
        :class:`~prefect_baton.errors.BatonError` is a tool error with its ``code`` and
        ``message``; any other failure is a tool error with the code
        :func:`~prefect_baton.errors.as_baton_error` gives it (``UNAVAILABLE`` for a
        database or Redis failure, else ``INTERNAL_ERROR``; logged).
    """
    tools = [_tool(spec) for spec in TOOLS.values()]
    tools += [_tool(TOOLS[a.tool], a) for a in SEED_ALIASES.values()]

    async def list_tools(
        _ctx: ServerRequestContext[Any, Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            found = resolve_tool(params.name, dict(params.arguments or {}))
        except BatonError as exc:
            return tool_error(exc.to_dict())
        if found is None:
            return tool_error({"code": "NOT_FOUND", "message": f"unknown tool {params.name!r}"})
        spec, arguments = found
        try:
            args = spec.model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            err = from_pydantic(exc, root="arguments", messages=rest_schemas.PATTERN_MESSAGES)
            return tool_error(err.to_dict())
        try:
            data = await anyio.to_thread.run_sync(partial(_call, identity, ctx, spec, args))
        except BatonError as exc:
            return tool_error(client_error(exc, _request_id(ctx)))
        except Exception as exc:
            rid = _request_id(ctx)
            logger.exception("tool %s failed (request %s)", spec.name, rid)
            return tool_error(client_error(as_baton_error(exc), rid))
        return _text_result(data, is_error=False)

    @asynccontextmanager
    async def lifespan(_server: Server[Any]) -> AsyncIterator[dict[str, Any]]:
        try:
            yield {}
        finally:
            if on_close is not None:
                on_close()

    return Server(
        SERVER_NAME,
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _unreadable_line(exc: Exception) -> types.JSONRPCError | None:
    """The JSON-RPC 2.0 answer to a stdin line the ``mcp`` package could not read as one
    message (``exc``: its parse error): ``-32700`` (parse error) for a line that is not
    JSON, else ``-32600`` (invalid request), with ``id`` null as JSON-RPC 2.0 requires
    when the id cannot be read; ``None`` for a blank line (no message, no answer)."""
    errors = exc.errors() if isinstance(exc, pydantic.ValidationError) else []
    if errors and isinstance(errors[0].get("input"), str) and not errors[0]["input"].strip():
        return None
    not_json = any(e.get("type") == "json_invalid" for e in errors) or not errors
    code, label = (
        (types.PARSE_ERROR, "Parse error")
        if not_json
        else (types.INVALID_REQUEST, "Invalid Request")
    )
    detail = errors[0].get("msg", "") if errors else str(exc)
    return types.JSONRPCError(
        jsonrpc="2.0", id=None, error=types.ErrorData(code=code, message=f"{label}: {detail}")
    )


#: How long (seconds) a closed stdin waits for the answers to requests already read.
EOF_GRACE_S = 60.0


def _refusal(code: int, label: str, detail: str, rid: types.RequestId | None) -> SessionMessage:
    return SessionMessage(
        types.JSONRPCError(
            jsonrpc="2.0", id=rid, error=types.ErrorData(code=code, message=f"{label}: {detail}")
        )
    )


class _Pairs(list[tuple[str, Any]]):
    """The key/value pairs of one JSON object, as read (repeats kept)."""


def _is_id(value: Any) -> bool:
    """Whether ``value`` is an MCP request id: a string or an integer (not a boolean)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _refused(text: str) -> SessionMessage | None:
    """The answer to a stdin line (UTF-8 ``text``) that is refused before the ``mcp``
    package reads it, else ``None`` (also when ``text`` is not JSON: the package then
    answers it as unreadable, :func:`_unreadable_line`):

    - an object naming a key twice, at any depth (the REST API's rule,
      :func:`~prefect_baton.rest._http.unique_keys`): ``-32600`` with the rule's words, and
      the request's ``id`` when its top-level ``id`` is given once as a string or integer,
      else ``id`` null;
    - a request (``method`` given) whose ``id`` is not a string or an integer (``null``,
      an object, ``1.5``, ``true``): ``-32600``, ``id`` null. MCP ids are strings or
      integers, and the package would take such a message for a notification and answer
      nothing, leaving its client waiting.
    """
    try:
        doc = json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        top = json.loads(text, object_pairs_hook=_Pairs)
        ids = [v for k, v in top if k == "id"] if isinstance(top, _Pairs) else []
        rid = ids[0] if len(ids) == 1 and _is_id(ids[0]) else None
        detail = f"invalid JSON ({exc})"
        return _refusal(types.INVALID_REQUEST, "Invalid Request", detail, rid)
    except (ValueError, RecursionError):
        return None
    if isinstance(doc, dict) and "method" in doc and "id" in doc and not _is_id(doc["id"]):
        detail = "id must be a string or an integer"
        return _refusal(types.INVALID_REQUEST, "Invalid Request", detail, None)
    return None


class _StdinLines:
    """``async for line in ...``: the process's stdin as ``str`` lines, for the ``stdin``
    argument of :func:`mcp.server.stdio.stdio_server` (which would read it as UTF-8 with
    ``errors="replace"``, so ``x\\xff`` and ``x\\xfe`` would both become ``x\\ufffd``). The bytes
    are read on a worker thread, one line (to ``\\n``) at a time; a line that is not UTF-8
    is answered ``-32700`` (naming its byte offset) and a line :func:`_refused` refuses with
    its answer, through the write stream given to :meth:`attach`, and is not passed on."""

    def __init__(self) -> None:
        self._write: WriteStream[SessionMessage] | None = None
        self._attached = anyio.Event()

    def attach(self, write: WriteStream[SessionMessage]) -> None:
        """Send refusals to ``write`` (the stdout side of ``stdio_server``)."""
        self._write = write
        self._attached.set()

    async def _refuse(self, answer: SessionMessage) -> None:
        await self._attached.wait()
        assert self._write is not None
        await self._write.send(answer)

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        while True:
            raw: bytes = await anyio.to_thread.run_sync(
                sys.stdin.buffer.readline, abandon_on_cancel=True
            )
            if not raw:
                raise StopAsyncIteration
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                detail = f"invalid JSON at byte {exc.start} (not UTF-8 text)"
                await self._refuse(_refusal(types.PARSE_ERROR, "Parse error", detail, None))
                continue
            refused = _refused(line)
            if refused is not None:
                await self._refuse(refused)
                continue
            return line


class _Unanswered:
    """The ids of the requests passed to the server and not yet answered (a response or
    an error written, or the client's ``notifications/cancelled``)."""

    def __init__(self) -> None:
        self._ids: Counter[types.RequestId] = Counter()
        self._changed = anyio.Event()

    def _drop(self, rid: Any) -> None:
        if self._ids.get(rid):
            self._ids[rid] -= 1
            if not self._ids[rid]:
                del self._ids[rid]
            self._changed.set()

    def read(self, message: types.JSONRPCMessage) -> None:
        """Note a message from the client."""
        if isinstance(message, types.JSONRPCRequest):
            self._ids[message.id] += 1
        elif (
            isinstance(message, types.JSONRPCNotification)
            and message.method == "notifications/cancelled"
        ):
            self._drop((message.params or {}).get("requestId"))

    def written(self, message: types.JSONRPCMessage) -> None:
        """Note a message to the client."""
        if isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)):
            self._drop(message.id)

    async def none_left(self) -> None:
        """Return once every request read has been answered."""
        while self._ids:
            self._changed = anyio.Event()
            await self._changed.wait()


async def _run_stdio(server: Server[Any]) -> None:
    """Serve ``server`` over stdin/stdout.

    Stdin is read by :class:`_StdinLines` (strict UTF-8, no repeated keys, request ids
    that are strings or integers). A line the ``mcp`` package cannot read as a JSON-RPC
    message (the package passes its parse error on, and its server only logs it) is
    answered with :func:`_unreadable_line` instead of no answer at all, so a client
    waiting on that request's reply learns at once that it was not read.

    When stdin ends, the server is stopped only once every request already read has been
    answered (for at most :data:`EOF_GRACE_S` seconds), so ``printf '...' | baton mcp``
    gets every answer (the ``mcp`` package would stop at once and drop the answers of
    calls still running, whose effects stay)."""
    lines = _StdinLines()
    async with stdio_server(stdin=cast(Any, lines)) as (read_stream, write_stream):
        lines.attach(write_stream)
        to_server, from_client = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        from_server, to_client = anyio.create_memory_object_stream[SessionMessage](0)
        unanswered = _Unanswered()

        async def client_to_server() -> None:
            async with to_server:
                async for item in read_stream:
                    if isinstance(item, Exception):
                        answer = _unreadable_line(item)
                        if answer is not None:
                            await write_stream.send(SessionMessage(answer))
                    else:
                        unanswered.read(item.message)
                        await to_server.send(item)
                with anyio.move_on_after(EOF_GRACE_S):
                    await unanswered.none_left()

        async def server_to_client() -> None:
            async with to_client:
                async for item in to_client:
                    unanswered.written(item.message)
                    await write_stream.send(item)
            await write_stream.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(client_to_server)
            tg.start_soon(server_to_client)
            async with from_server:
                await server.run(from_client, from_server, server.create_initialization_options())


def serve_stdio(baton: Baton) -> None:
    """Serve the tools over stdin/stdout until the client closes stdin.

    Every call acts as ``baton``'s identity (its org, principal and role): over stdio the
    process is trusted with the identity it was configured with, as every ``baton``
    command is.

    Args:
        baton: the client (:class:`~prefect_baton.Baton`); the caller closes it.
    """
    server = build_server(lambda _ctx: (baton, None))
    anyio.run(_run_stdio, server)


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
    are ``400``, and a body over the REST API's limit (the larger of 2 MiB and 3 times the
    checkpoint state cap + 64 KiB, :func:`~prefect_baton._rules.validation.request_body_limit`
    of the store's ``state_max_bytes``) is ``413`` (as the REST API, through its
    :class:`~prefect_baton.rest._http.BatonMiddleware`). Keys are never logged. No MCP
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
    app.add_middleware(_UnavailableAs503)
    # Outermost: request ids, one Authorization header, no key in the URL, the body cap.
    app.add_middleware(BatonMiddleware, engines=lambda: store.engines, max_body_bytes=limit)
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
