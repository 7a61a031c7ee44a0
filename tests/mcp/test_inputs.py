"""The MCP tools apply the input rules of the REST API: an integer argument is a JSON
integer (``3.0`` is refused, as a string or a boolean is), an id holding an invisible
format character is refused by the id rule, and over HTTP a JSON body naming a key twice
is refused before any tool runs. Each is ``VALIDATION_ERROR`` and writes nothing."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from mcp.client.client import Client

from prefect_baton.mcp import build_server
from prefect_baton.testing import memory_baton

from .conftest import LEASE, HttpServer, ok, row_counts, run, tool_error


@pytest.mark.parametrize("value", [3.0, 0.0, "3", True], ids=["3.0", "0.0", "str", "bool"])
def test_integer_arguments_take_only_json_integers(value: Any) -> None:
    """``expected_version``, ``epoch``, ``ttl_seconds`` and ``limit`` given as ``3.0``, a
    string or a boolean are VALIDATION_ERROR naming the argument; nothing is written."""
    baton = memory_baton(org="org-int", principal="alice")
    server = build_server(lambda _ctx: (baton, None))

    async def main() -> None:
        async with Client(server) as client:
            lease = ok(await client.call_tool("baton_lease_acquire", LEASE))
            lid = lease["lease_id"]
            calls: list[tuple[str, dict[str, Any], str]] = [
                ("baton_lease_acquire", {**LEASE, "expected_version": value}, "expected_version"),
                ("baton_lease_acquire", {**LEASE, "ttl_seconds": value}, "ttl_seconds"),
                ("baton_lease_renew", {"lease_id": lid, "expected_version": value}, "version"),
                ("baton_lease_release", {"lease_id": lid, "expected_version": value}, "version"),
                (
                    "baton_checkpoint_save",
                    {"subject_id": "s", "kind": "k", "state": {}, "lease_id": lid, "epoch": value},
                    "epoch",
                ),
                ("baton_event_list", {"limit": value}, "limit"),
            ]
            for name, arguments, field in calls:
                err = tool_error(await client.call_tool(name, arguments), "VALIDATION_ERROR")
                assert field in err["message"], (name, err)
            events = ok(await client.call_tool("baton_event_list", {}))["events"]
            assert [e["kind"] for e in events] == ["lease.acquired"]

    try:
        run(main)
    finally:
        baton.close()


@pytest.mark.parametrize("char", ["\u200b", "\ufeff", "\u00ad", "\U000e0041"])
def test_ids_with_format_characters_are_refused(char: str) -> None:
    """A resource id or recipient holding an invisible format character (category Cf) is
    VALIDATION_ERROR, the id rule of every surface."""
    baton = memory_baton(org="org-cf", principal="alice")
    server = build_server(lambda _ctx: (baton, None))

    async def main() -> None:
        async with Client(server) as client:
            acquire = {**LEASE, "resource_id": f"svc{char}"}
            err = tool_error(
                await client.call_tool("baton_lease_acquire", acquire), "VALIDATION_ERROR"
            )
            assert f"found U+{ord(char):04X}" in err["message"]
            handoff = {"to_principal": f"bob{char}", "subject_id": "s"}
            err = tool_error(
                await client.call_tool("baton_handoff_create", handoff), "VALIDATION_ERROR"
            )
            assert "to_principal must not contain invisible format characters" in err["message"]
            assert ok(await client.call_tool("baton_event_list", {}))["events"] == []

    try:
        run(main)
    finally:
        baton.close()


def test_a_key_twice_in_a_request_body_is_400_over_http(http_server: HttpServer) -> None:
    """Over HTTP the body a JSON key appears twice in (here ``ttl_seconds`` in a tool's
    arguments, or the JSON-RPC ``method``) is answered 400 with the JSON-RPC error stdio
    gives the same line: ``-32600`` with the request's id and the REST API's words, before
    the MCP layer reads it; nothing is written."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Authorization": f"Bearer {http_server.key('agent-a')}",
    }
    arguments = json.dumps(LEASE)[:-1] + ', "ttl_seconds": 10}'
    bodies = [
        (
            '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": '
            '"baton_lease_acquire", "arguments": ' + arguments + "}}",
            "ttl_seconds",
        ),
        (
            '{"jsonrpc": "2.0", "id": 1, "method": "initialize", "method": "ping", "params": {}}',
            "method",
        ),
    ]
    before = row_counts(http_server.ledger_url)
    for body, key in bodies:
        resp = httpx.post(http_server.url, content=body.encode(), headers=headers, timeout=30)
        assert resp.status_code == 400, resp.text
        assert resp.json() == {
            "jsonrpc": "2.0",
            "id": 1,
            "error": {
                "code": -32600,
                "message": f"Invalid Request: invalid JSON (the key '{key}' appears twice in "
                "one object)",
            },
        }
    assert row_counts(http_server.ledger_url) == before
