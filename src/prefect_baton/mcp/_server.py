"""The MCP server: the tools of :mod:`._tools` on the ``mcp`` package's low-level
:class:`~mcp.server.lowlevel.Server`, served over stdio (:mod:`._stdio`) or streamable HTTP
(:mod:`._http`); the envelope rule both transports apply is :mod:`._envelope`.

The low-level server is used rather than :class:`~mcp.server.MCPServer` because the latter
derives each tool's argument model from a function signature, and that model ignores
unknown fields; here each tool's ``inputSchema`` is its pydantic model's JSON schema
(``additionalProperties: false``) and the same model validates the call.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import mcp.types as types
import pydantic
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from prefect_baton import __version__
from prefect_baton._client.sync import Baton
from prefect_baton._rules.access import check_scope
from prefect_baton.errors import (
    BatonError,
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
    client_error,
    new_request_id,
)

__all__ = ["Identity", "build_server", "tool_error"]

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
