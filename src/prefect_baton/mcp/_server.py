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
import os
import signal
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, cast

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import mcp.types as types
import pydantic
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prefect_baton import __version__
from prefect_baton._client.sync import Baton
from prefect_baton._rules.access import check_scope
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
    find_tool,
)
from prefect_baton.rest import _schemas as rest_schemas
from prefect_baton.rest._http import (
    BatonMiddleware,
    DuplicateKey,
    baton_error_response,
    check_host,
    client_error,
    is_json,
    new_request_id,
    replaying,
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
    identity: Identity,
    ctx: ServerRequestContext[Any, Any],
    spec: ToolSpec,
    alias: SeedAlias | None,
    arguments: dict[str, Any],
) -> Any:
    """Run one tool call (on a worker thread): the key's scope first
    (:func:`~prefect_baton._rules.access.check_scope`, the REST API's rule and order, so a
    key that may not use the tool gets ``FORBIDDEN`` whatever its arguments), then the
    arguments (``VALIDATION_ERROR``), then the tool."""
    baton, granted = identity(ctx)
    grant = _TRUSTED if granted is None else granted
    check_scope(grant.scopes, spec.scope)
    if alias is not None:
        arguments = alias.arguments(arguments)
    try:
        args = spec.model.model_validate(arguments)
    except pydantic.ValidationError as exc:
        raise from_pydantic(exc, root="arguments", messages=rest_schemas.PATTERN_MESSAGES) from None
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
        A :class:`mcp.server.lowlevel.Server`. A call of a tool whose scope the key lacks
        is a tool error with ``FORBIDDEN``, whatever its arguments (the scope is checked
        first, as the REST API does); one with unknown or badly typed arguments
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
        found = find_tool(params.name)
        if found is None:
            return tool_error({"code": "NOT_FOUND", "message": f"unknown tool {params.name!r}"})
        spec, alias = found
        arguments = dict(params.arguments or {})
        try:
            call = partial(_call, identity, ctx, spec, alias, arguments)
            data = await anyio.to_thread.run_sync(call)
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


#: How long (seconds) a closed stdin, SIGINT or SIGTERM waits for the answers to the
#: requests already read.
EOF_GRACE_S = 60.0


def _refusal(code: int, label: str, detail: str, rid: types.RequestId | None) -> types.JSONRPCError:
    return types.JSONRPCError(
        jsonrpc="2.0", id=rid, error=types.ErrorData(code=code, message=f"{label}: {detail}")
    )


class _Pairs(list[tuple[str, Any]]):
    """The key/value pairs of one JSON object that names a key twice, as read."""


def _is_id(value: Any) -> bool:
    """Whether ``value`` is an MCP request id: a string or an integer (not a boolean)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _envelope_problem(exc: pydantic.ValidationError) -> tuple[int, str, str]:
    """The JSON-RPC code, label and one-line detail of a message that is JSON but not a
    JSON-RPC message of MCP: ``-32602`` (invalid params) when only its ``params`` are
    wrong, else ``-32600`` (invalid request); the detail names each field and what it
    must be (:func:`~prefect_baton.errors.from_pydantic`, no pydantic URL)."""
    errors = exc.errors()
    detail = str(from_pydantic(exc, root="message"))
    if errors and all(tuple(e.get("loc", ()))[:1] == ("params",) for e in errors):
        return types.INVALID_PARAMS, "Invalid params", detail
    return types.INVALID_REQUEST, "Invalid Request", detail


def screen_message(
    doc: Any, duplicate: DuplicateKey | None = None
) -> types.JSONRPCMessage | types.JSONRPCError:
    """One JSON document ``doc`` a client sent (a stdin line or an HTTP body, read once by
    :func:`read_message`) as the JSON-RPC message the ``mcp`` package serves, or the
    JSON-RPC error that answers it instead. The one envelope rule of both transports:

    - an object naming a key twice, at any depth (``duplicate``: the first one, by the
      REST API's rule :func:`~prefect_baton.rest._http.unique_keys`): ``-32600`` with the
      rule's words, and the request's ``id`` when its top-level ``id`` is given once as a
      string or integer, else ``id`` null;
    - a request (``method`` given) whose ``id`` is not a string or an integer (``null``,
      an object, ``1.5``, ``true``): ``-32600``, ``id`` null. MCP ids are strings or
      integers, and the package would take such a message for a notification and answer
      nothing (HTTP ``202``), leaving its client waiting;
    - a request whose ``params`` are not an object, or a ``tools/call`` whose ``name`` is
      not a string or whose ``arguments`` are not an object: ``-32602`` (invalid params)
      with its ``id``; any other shape that is not a JSON-RPC message: ``-32600``, ``id``
      null. The message names the field and what it must be, in one line
      (``Invalid params: params.arguments: Input should be a valid dictionary``).
    """
    if duplicate is not None:
        if isinstance(doc, _Pairs):
            ids = [v for k, v in doc if k == "id"]
        else:
            ids = [doc.get("id")] if isinstance(doc, dict) else []
        rid = ids[0] if len(ids) == 1 and _is_id(ids[0]) else None
        detail = f"invalid JSON ({duplicate})"
        return _refusal(types.INVALID_REQUEST, "Invalid Request", detail, rid)
    if not isinstance(doc, dict):
        detail = f"a JSON-RPC message is a JSON object, not {_json_kind(doc)}"
        return _refusal(types.INVALID_REQUEST, "Invalid Request", detail, None)
    if "method" in doc and "id" in doc and not _is_id(doc["id"]):
        detail = "id must be a string or an integer"
        return _refusal(types.INVALID_REQUEST, "Invalid Request", detail, None)
    try:
        if "method" not in doc:
            return types.jsonrpc_message_adapter.validate_python(doc, by_name=False)
        kind = types.JSONRPCRequest if "id" in doc else types.JSONRPCNotification
        message = kind.model_validate(doc, by_name=False)
    except pydantic.ValidationError as exc:
        code, label, detail = _envelope_problem(exc)
        rid = doc.get("id") if code == types.INVALID_PARAMS else None
        return _refusal(code, label, detail, rid)
    params_type = _PARAMS.get(message.method)
    if isinstance(message, types.JSONRPCRequest) and params_type is not None:
        try:
            params_type.model_validate(message.params or {}, by_name=False)
        except pydantic.ValidationError as exc:
            detail = str(from_pydantic(exc, name=lambda loc: ".".join(map(str, ("params", *loc)))))
            return _refusal(types.INVALID_PARAMS, "Invalid params", detail, message.id)
    return message


#: The ``params`` model of each method whose params :func:`screen_message` checks, so a
#: malformed ``tools/call`` (``arguments`` not an object, ``name`` not a string or
#: missing) gets a message naming the field instead of the package's bare ``Invalid
#: request parameters``.
_PARAMS: dict[str, type[pydantic.BaseModel]] = {"tools/call": types.CallToolRequestParams}


def _json_kind(doc: Any) -> str:
    """What JSON value ``doc`` is (``an array``, ``a string``, ...)."""
    if isinstance(doc, list):
        return "an array"
    if isinstance(doc, str):
        return "a string"
    if isinstance(doc, bool):
        return "a boolean"
    if doc is None:
        return "null"
    return "a number"


def read_message(text: str) -> types.JSONRPCMessage | types.JSONRPCError | None:
    """The message of one client document ``text`` (``str``: a stdin line or an HTTP
    body), parsed once and screened by :func:`screen_message`; ``None`` for blank text
    (no message, no answer). Text that is not JSON is answered ``-32700`` (parse error,
    ``id`` null, the position of the fault), JSON nested too deeply for Python
    ``-32600``."""
    if not text.strip():
        return None
    found: list[DuplicateKey] = []

    def pairs(items: list[tuple[str, Any]]) -> Any:
        try:
            return unique_keys(items)
        except DuplicateKey as exc:
            found.append(exc)
            return _Pairs(items)

    try:
        doc = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        at = len(text[: exc.pos].encode("utf-8", "surrogatepass"))
        detail = f"invalid JSON at byte {at} ({exc.msg})"
        return _refusal(types.PARSE_ERROR, "Parse error", detail, None)
    except RecursionError:
        return _refusal(types.INVALID_REQUEST, "Invalid Request", "nested too deeply", None)
    except ValueError as exc:  # an integer over the digits int() reads
        return _refusal(types.PARSE_ERROR, "Parse error", f"invalid JSON ({exc})", None)
    return screen_message(doc, found[0] if found else None)


def _stdin_lines(fd: int) -> Iterator[bytes]:
    """The lines (``bytes``, each with its ``\\n``; the last one may lack it) read from the
    file descriptor ``fd`` with :func:`os.read`, without Python's buffered reader (whose
    lock a thread still blocked in it at exit would turn into a fatal error)."""
    pending = bytearray()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            if pending:
                yield bytes(pending)
            return
        start = len(pending)
        pending += chunk
        while (end := pending.find(b"\n", start)) >= 0:
            yield bytes(pending[: end + 1])
            del pending[: end + 1]
            start = 0


def _read_stdin(send: MemoryObjectSendStream[bytes], token: Any) -> None:
    """Pass the process's stdin (file descriptor 0), one line at a time, to ``send`` on
    the event loop of ``token``, until stdin ends (then ``send`` is closed) or the server
    stops reading. Runs on a daemon thread of its own, so a read still blocked when the
    server stops on a signal does not keep the process alive (a worker thread of
    ``anyio`` would)."""
    try:
        for raw in _stdin_lines(0):
            anyio.from_thread.run(send.send, raw, token=token)
        anyio.from_thread.run_sync(send.close, token=token)
    except Exception:  # the server stopped reading: nobody wants the line
        return


class _NoLines:
    """An empty stdin for :func:`mcp.server.stdio.stdio_server`: :func:`_run_stdio`
    reads the process's stdin itself (:func:`_read_stdin`)."""

    def __aiter__(self) -> _NoLines:
        return self

    async def __anext__(self) -> str:
        raise StopAsyncIteration


def _read_stdin_line(raw: bytes) -> types.JSONRPCMessage | types.JSONRPCError | None:
    """The message of one stdin line ``raw`` (``bytes``), by :func:`read_message`; a line
    that is not UTF-8 is answered ``-32700`` naming its byte offset (the ``mcp`` package
    would read it with ``errors="replace"``, so ``x\\xff`` and ``x\\xfe`` would both become
    ``x\\ufffd``)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        detail = f"invalid JSON at byte {exc.start} (not UTF-8 text)"
        return _refusal(types.PARSE_ERROR, "Parse error", detail, None)
    return read_message(line)


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


async def _run_stdio(server: Server[Any]) -> int | None:
    """Serve ``server`` over stdin/stdout; returns the number of the signal that stopped
    it (``SIGINT``, ``SIGTERM``), or ``None`` when stdin ended.

    Stdin is read here, one line at a time on a worker thread, and each line is parsed
    once (:func:`_read_stdin_line`: strict UTF-8, no repeated keys, request ids that are
    strings or integers); a line that is not a JSON-RPC message is answered with its
    JSON-RPC error at once (the ``mcp`` package would only log it), so a client waiting on
    that request's reply learns that it was not read.

    When stdin ends, or on the first SIGINT or SIGTERM, no further line is read, and the
    server is stopped only once every request already read has been answered (for at most
    :data:`EOF_GRACE_S` seconds; a second signal stops the wait), so ``printf '...' | baton
    mcp`` and Ctrl-C during a call get every answer: the ``mcp`` package would stop at
    once and drop the answers of calls still running, whose effects (a lease taken, its
    fencing token) stay."""
    async with stdio_server(stdin=cast(Any, _NoLines())) as (read_stream, write_stream):
        await read_stream.aclose()
        to_server, from_client = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        from_server, to_client = anyio.create_memory_object_stream[SessionMessage](0)
        unanswered = _Unanswered()
        reading, grace, watching = anyio.CancelScope(), anyio.CancelScope(), anyio.CancelScope()
        send_line, lines = anyio.create_memory_object_stream[bytes](0)
        token = anyio.lowlevel.current_token()
        threading.Thread(
            target=_read_stdin, args=(send_line, token), name="baton-mcp-stdin", daemon=True
        ).start()
        signalled: list[int] = []

        async def watch_signals(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            with watching, anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                task_status.started()
                async for signum in signals:
                    signalled.append(int(signum))
                    (reading if len(signalled) == 1 else grace).cancel()

        async def client_to_server() -> None:
            async with to_server:
                with reading:
                    async for raw in lines:
                        message = _read_stdin_line(raw)
                        # A line read is passed on whole even when a signal stops the
                        # reading meanwhile: its request is then waited for.
                        with anyio.CancelScope(shield=True):
                            if isinstance(message, types.JSONRPCError):
                                await write_stream.send(SessionMessage(message))
                            elif message is not None:
                                unanswered.read(message)
                                await to_server.send(SessionMessage(message))
                lines.close()
                with grace, anyio.move_on_after(EOF_GRACE_S):
                    await unanswered.none_left()

        async def server_to_client() -> None:
            async with to_client:
                async for item in to_client:
                    unanswered.written(item.message)
                    await write_stream.send(item)
            await write_stream.aclose()

        async with anyio.create_task_group() as tg:
            await tg.start(watch_signals)
            tg.start_soon(client_to_server)
            tg.start_soon(server_to_client)
            async with from_server:
                await server.run(from_client, from_server, server.create_initialization_options())
            watching.cancel()
    return signalled[0] if signalled else None


def serve_stdio(baton: Baton) -> int | None:
    """Serve the tools over stdin/stdout until the client closes stdin or the process gets
    SIGINT or SIGTERM; either way the calls already read are answered first (for at most
    :data:`EOF_GRACE_S` seconds; a second signal stops that wait), and no new line is read.

    Every call acts as ``baton``'s identity (its org, principal and role): over stdio the
    process is trusted with the identity it was configured with, as every ``baton``
    command is.

    Args:
        baton: the client (:class:`~prefect_baton.Baton`); the caller closes it.

    Returns:
        The number of the signal that stopped the server (``signal.SIGINT`` or
        ``signal.SIGTERM``, ``int``), or ``None`` when stdin ended.
    """
    server = build_server(lambda _ctx: (baton, None))
    return anyio.run(_run_stdio, server)


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
    :func:`screen_message` refuses (a request id that is not a string or an integer,
    ``params`` that are not an object, an object that is not a JSON-RPC message) is
    answered ``400`` with its JSON-RPC error, as over stdio, before the package sees it (it
    would take a request with a bad id for a notification and answer ``202`` with nothing,
    and put pydantic's whole report in the message of the others). Runs after
    :class:`~prefect_baton.rest._http.BatonMiddleware`, which has already refused a body
    over the limit, one that is not JSON and one naming a key twice."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        screened = scope["type"] == "http" and scope.get("method") == "POST" and is_json(scope)
        # A request without a valid key is left to the package's bearer check (401).
        if not screened or not isinstance(scope.get("user"), AuthenticatedUser):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        answer = _screened_body(body)
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


def _screened_body(body: bytes) -> types.JSONRPCError | None:
    """The JSON-RPC error answering an HTTP ``body`` (``bytes``, JSON in the encoding
    :func:`json.detect_encoding` finds) by :func:`read_message`, else ``None`` (no body,
    or a message to serve)."""
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")
    except UnicodeDecodeError:  # refused already by BatonMiddleware
        return None
    answer = read_message(text)
    return answer if isinstance(answer, types.JSONRPCError) else None


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
    _screen_endpoint(app)
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
