"""The MCP server of prefect-baton: the coordination loop as MCP tools (``mcp`` package,
2.x), served over stdio or streamable HTTP by ``baton mcp``.

Tools: ``baton_lease_acquire``, ``baton_lease_renew``, ``baton_lease_release``,
``baton_lease_inspect``, ``baton_lease_transfer``, ``baton_lease_force_release``,
``baton_lease_acquire_many``, ``baton_lease_list``, ``baton_checkpoint_save``,
``baton_checkpoint_get``, ``baton_checkpoint_history``, ``baton_checkpoint_delete``,
``baton_handoff_create``, ``baton_handoff_inbox``, ``baton_handoff_resolve``,
``baton_handoff_show``, ``baton_outcome_record``, ``baton_outcome_list``,
``baton_event_list``, ``baton_whoami``; and the seed service's names
(:data:`SEED_ALIASES`: ``titen_lease_acquire``, ``titen_checkpoint_save``,
``titen_checkpoint_get``, ``titen_handoff``). Each tool calls the same function of
:mod:`prefect_baton.rest._calls` as its REST route. Each input schema rejects unknown fields;
a result is the JSON form of what the Python API returns; an error is a tool error whose
text is ``{"error": {"code": ..., "message": ...}}`` with the codes of
:mod:`prefect_baton.errors`.

Over stdio every call acts as the configured principal; over HTTP each request's bearer
key (:func:`prefect_baton.rest.keys.create_key`) decides org, principal and role.

This package is named like the ``mcp`` package it builds on, as
:mod:`prefect_baton.prefect` is named like Prefect: imports are absolute, so
``import mcp`` inside it is the SDK.
"""

from __future__ import annotations

from prefect_baton.mcp._http import http_app, serve_http
from prefect_baton.mcp._server import Identity, build_server, tool_error
from prefect_baton.mcp._stdio import serve_stdio
from prefect_baton.mcp._tools import SEED_ALIASES, TOOLS, Grant, SeedAlias, ToolSpec

__all__ = [
    "SEED_ALIASES",
    "TOOLS",
    "Grant",
    "Identity",
    "SeedAlias",
    "ToolSpec",
    "build_server",
    "http_app",
    "serve_http",
    "serve_stdio",
    "tool_error",
]
