"""``baton mcp --transport http`` served in a subprocess on a free 127.0.0.1 port, driven by
the ``mcp`` package's streamable HTTP client and client session: each request's bearer key
decides org, principal and role."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from prefect_baton.mcp._envelope import Refusal, read_bytes
from prefect_baton.rest.keys import create_key, revoke_key
from tests.conftest import INITIALIZE

from ..conftest import REDIS_URL, require_redis
from .conftest import (
    LEASE,
    HttpServer,
    ok,
    race,
    row_counts,
    run,
    start_http,
    stop,
    tool_error,
)
from .test_stdio import TOOL_NAMES

MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


def _raw_initialize(url: str, authorization: str | None) -> httpx.Response:
    headers = dict(MCP_HEADERS)
    if authorization is not None:
        headers["Authorization"] = authorization
    return httpx.post(url, json=INITIALIZE, headers=headers, timeout=30)


def test_lists_the_tools_over_http(http_server: HttpServer) -> None:
    """An authenticated client session lists every coordination tool."""
    key = http_server.key("agent-a")

    async def main() -> None:
        async with http_server.session(key) as s:
            assert {t.name for t in (await s.list_tools()).tools} == TOOL_NAMES

    run(main)


def _race_for_one_lease(server: HttpServer) -> None:
    keys = [server.key("agent-a"), server.key("agent-b")]

    async def main() -> None:
        async with AsyncExitStack() as stack:
            sessions: list[ClientSession] = [
                await stack.enter_async_context(server.session(k)) for k in keys
            ]

            def acquire(s: ClientSession) -> Any:
                return lambda: s.call_tool("baton_lease_acquire", LEASE)

            results = await race([acquire(s) for s in sessions])
            winners = [i for i, r in enumerate(results) if not r.is_error]
            assert len(winners) == 1
            w = winners[0]
            lease = ok(results[w])
            assert lease["owner"] == ["agent-a", "agent-b"][w]
            err = tool_error(results[1 - w], "CONFLICT")
            assert "agent-" not in err["message"]
            lost = await sessions[1 - w].call_tool(
                "baton_lease_release", {"lease_id": lease["lease_id"]}
            )
            tool_error(lost, "NOT_FOUND")
            mine = await sessions[w].call_tool(
                "baton_lease_release", {"lease_id": lease["lease_id"]}
            )
            assert ok(mine)["status"] == "released"

    run(main)


def test_two_clients_race_for_one_lease_over_http(http_server: HttpServer) -> None:
    """Two keys acquire one resource at once: exactly one wins, the other gets CONFLICT
    and a NOT_FOUND releasing the winner's lease."""
    _race_for_one_lease(http_server)
    assert row_counts(http_server.ledger_url)["baton_leases"] == 1


def test_race_with_redis_as_the_lease_authority(ledger_url: str, org: str, tmp_path: Path) -> None:
    """With --redis-url the same race has the same answer (Redis on 127.0.0.1:6379)."""
    require_redis()
    log = tmp_path / "mcp-redis.log"
    proc, url = start_http(ledger_url, log, redis_url=REDIS_URL)
    try:
        _race_for_one_lease(HttpServer(url=url, log=log, ledger_url=ledger_url, org=org))
    finally:
        stop(proc)


def test_handoff_created_by_one_key_is_resolved_by_the_other(http_server: HttpServer) -> None:
    """A handoff created with Alice's key is in the inbox of Bob's key and accepted there;
    Alice's inbox stays empty."""
    alice_key, bob_key = http_server.key("alice"), http_server.key("bob")

    async def main() -> None:
        async with http_server.session(alice_key) as alice, http_server.session(bob_key) as bob:
            lease = ok(await alice.call_tool("baton_lease_acquire", LEASE))
            handoff = ok(
                await alice.call_tool(
                    "baton_handoff_create",
                    {"to_principal": "bob", "subject_id": "svc", "lease_id": lease["lease_id"]},
                )
            )
            assert handoff["from_principal"] == "alice"
            assert ok(await alice.call_tool("baton_handoff_inbox", {})) == {
                "handoffs": [],
                "next_cursor": None,
            }
            inbox = ok(await bob.call_tool("baton_handoff_inbox", {}))["handoffs"]
            assert [h["handoff_id"] for h in inbox] == [handoff["handoff_id"]]
            accepted = ok(
                await bob.call_tool(
                    "baton_handoff_resolve",
                    {"handoff_id": handoff["handoff_id"], "status": "accepted"},
                )
            )
            assert accepted["lease"]["owner"] == "bob"
            stale = await alice.call_tool(
                "baton_outcome_record",
                {
                    "subject_id": "svc",
                    "status": "failed",
                    "lease_id": lease["lease_id"],
                    "epoch": lease["epoch"],
                },
            )
            tool_error(stale, "STALE_FENCE")

    run(main)


@pytest.mark.parametrize("case", ["missing", "not-bearer", "unknown", "revoked"])
def test_bad_keys_are_refused_before_any_tool_runs(http_server: HttpServer, case: str) -> None:
    """A missing, malformed, unknown or revoked key gets HTTP 401 (with WWW-Authenticate),
    the client session cannot start, and nothing is written."""
    before = row_counts(http_server.ledger_url)
    secret = http_server.key("agent-a")
    authorization: str | None
    if case == "missing":
        authorization = None
    elif case == "not-bearer":
        authorization = f"Basic {secret}"
    elif case == "unknown":
        authorization = "Bearer bk_" + "x" * 43
    else:
        secret, key = create_key(http_server.ledger_url, org=http_server.org, principal="gone")
        revoke_key(http_server.ledger_url, key_id=key.key_id)
        authorization = f"Bearer {secret}"

    resp = _raw_initialize(http_server.url, authorization)
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"].startswith("Bearer")

    if case != "not-bearer":  # the client session always sends a Bearer header
        token = authorization.split(" ", 1)[1] if authorization else None

        async def main() -> None:
            async with http_server.session(token) as s:
                await s.call_tool("baton_lease_acquire", LEASE)

        with pytest.raises(BaseExceptionGroup) as raised:
            run(main)
        assert raised.value.subgroup(MCPError) is not None, raised.value
    assert row_counts(http_server.ledger_url) == before


def test_the_principal_is_the_keys_not_the_clients(http_server: HttpServer) -> None:
    """The server was started with --principal mallory and the client asserts other
    identities, yet every call acts as the key's principal: a `principal` argument is an
    unknown field, and identity headers are ignored."""
    key = http_server.key("alice")

    async def main() -> None:
        async with http_server.session(key) as s:
            claimed = await s.call_tool("baton_lease_acquire", {**LEASE, "principal": "mallory"})
            tool_error(claimed, "VALIDATION_ERROR")
            lease = ok(await s.call_tool("baton_lease_acquire", LEASE))
            assert lease["owner"] == "alice"
            ckpt = ok(
                await s.call_tool(
                    "baton_checkpoint_save", {"subject_id": "svc", "kind": "k", "state": {"a": 1}}
                )
            )
            assert ckpt["principal"] == "alice"

    run(main)
    raw = _raw_initialize(http_server.url, f"Bearer {key}")
    assert raw.status_code == 200


def test_whoami_names_the_bearer_key(http_server: HttpServer) -> None:
    """Over HTTP ``baton_whoami`` gives the key's id and its scopes, as ``GET /v1/me`` does
    (over stdio, with no key, both are null: test_tools_more)."""
    secret, key = create_key(
        http_server.ledger_url,
        org=http_server.org,
        principal="alice",
        role="agent",
        scopes=["leases:read"],
    )

    async def main() -> None:
        async with http_server.session(secret) as s:
            me = ok(await s.call_tool("baton_whoami", {}))
            assert me["key_id"] == key.key_id
            assert me["scopes"] == ["leases:read"]
            assert (me["principal"], me["role"]) == ("alice", "agent")

    run(main)


def test_whoami_over_stdio_has_no_key(stdio_session: Any) -> None:
    """Over stdio there is no bearer key: ``key_id`` and ``scopes`` are null (every tool)."""

    async def main() -> None:
        async with stdio_session("agent-a") as s:
            me = ok(await s.call_tool("baton_whoami", {}))
            assert (me["key_id"], me["scopes"]) == (None, None)
            assert me["principal"] == "agent-a"

    run(main)


def test_a_key_without_the_scope_gets_forbidden(http_server: HttpServer) -> None:
    """A read-only key may inspect but not acquire (FORBIDDEN tool error, nothing written)."""
    key = http_server.key("reader", scopes=["leases:read"])
    before = row_counts(http_server.ledger_url)

    async def main() -> None:
        async with http_server.session(key) as s:
            err = tool_error(await s.call_tool("baton_lease_acquire", LEASE), "FORBIDDEN")
            assert "leases:write" in err["message"]
            info = ok(
                await s.call_tool(
                    "baton_lease_inspect",
                    {"resource_type": LEASE["resource_type"], "resource_id": LEASE["resource_id"]},
                )
            )
            assert info["held"] is False

    run(main)
    assert row_counts(http_server.ledger_url) == before


def test_the_scope_is_checked_before_the_arguments(http_server: HttpServer) -> None:
    """A key without a tool's scope gets FORBIDDEN (the REST API's words) whatever the
    call's arguments: unknown fields, wrong types, a seed alias given both names; the
    same bad arguments from a key with the scope are VALIDATION_ERROR."""
    reader = http_server.key("reader", scopes=["leases:read"])
    writer = http_server.key("writer", scopes=["leases:write"])
    bad_calls: list[tuple[str, dict[str, Any], str]] = [
        ("baton_lease_acquire", {**LEASE, "x": 1}, "leases:write"),
        ("baton_lease_acquire", {**LEASE, "ttl_seconds": "long"}, "leases:write"),
        ("baton_lease_acquire", {}, "leases:write"),
        ("titen_checkpoint_get", {"agent_id": "a", "principal": "b"}, "checkpoints:read"),
    ]
    before = row_counts(http_server.ledger_url)

    async def main() -> None:
        async with http_server.session(reader) as s:
            for name, arguments, need in bad_calls:
                err = tool_error(await s.call_tool(name, arguments), "FORBIDDEN")
                assert err["message"] == f"this key lacks the scope {need}"
        async with http_server.session(writer) as s:
            for name, arguments, _ in bad_calls[:3]:
                tool_error(await s.call_tool(name, arguments), "VALIDATION_ERROR")

    run(main)
    assert row_counts(http_server.ledger_url) == before


def test_another_orgs_key_sees_nothing(http_server: HttpServer) -> None:
    """A key of another org gets NOT_FOUND for this org's handoff and lease ids."""
    mine = http_server.key("alice")
    other, _ = create_key(http_server.ledger_url, org=http_server.org + "-x", principal="bob")

    async def main() -> None:
        async with http_server.session(mine) as a, http_server.session(other) as b:
            lease = ok(await a.call_tool("baton_lease_acquire", LEASE))
            handoff = ok(
                await a.call_tool(
                    "baton_handoff_create", {"to_principal": "bob", "subject_id": "s"}
                )
            )
            assert ok(await b.call_tool("baton_handoff_inbox", {})) == {
                "handoffs": [],
                "next_cursor": None,
            }
            tool_error(
                await b.call_tool("baton_handoff_show", {"handoff_id": handoff["handoff_id"]}),
                "NOT_FOUND",
            )
            tool_error(
                await b.call_tool("baton_lease_release", {"lease_id": lease["lease_id"]}),
                "NOT_FOUND",
            )

    run(main)


def test_another_agents_checkpoint_is_not_found(http_server: HttpServer) -> None:
    """baton_checkpoint_get: another agent of the org gets NOT_FOUND for alice's checkpoint
    (by id and by principal) until a handoff carries it to them; an admin reads it."""
    alice, bob = http_server.key("alice"), http_server.key("bob")
    admin = http_server.key("root", role="admin")
    by_key = {"subject_id": "s", "kind": "progress", "principal": "alice"}

    async def main() -> None:
        async with (
            http_server.session(alice) as a,
            http_server.session(bob) as b,
            http_server.session(admin) as r,
        ):
            ck = ok(
                await a.call_tool(
                    "baton_checkpoint_save", {"subject_id": "s", "kind": "progress", "state": {}}
                )
            )
            by_id = {"checkpoint_id": ck["checkpoint_id"]}
            for args in (by_id, by_key):
                tool_error(await b.call_tool("baton_checkpoint_get", args), "NOT_FOUND")
                assert ok(await r.call_tool("baton_checkpoint_get", args))["version"] == 1
            offer = {"to_principal": "bob", "subject_id": "s", **by_id}
            ok(await a.call_tool("baton_handoff_create", offer))
            for args in (by_id, by_key):
                assert ok(await b.call_tool("baton_checkpoint_get", args))["version"] == 1

    run(main)


def test_keys_never_reach_the_server_log(http_server: HttpServer) -> None:
    """Neither an accepted nor a refused key appears in the server's output."""
    good = http_server.key("alice")
    bad = "bk_" + "y" * 43

    async def main() -> None:
        async with http_server.session(good) as s:
            ok(await s.call_tool("baton_lease_acquire", LEASE))

    run(main)
    assert _raw_initialize(http_server.url, f"Bearer {bad}").status_code == 401
    log = http_server.log.read_text(encoding="utf-8", errors="replace")
    assert "POST /mcp" in log
    assert good not in log
    assert bad not in log


def test_an_unavailable_ledger_during_key_lookup_is_503(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the ledger cannot be reached while a key is checked, the answer is 503 with
    the UNAVAILABLE envelope (not a bare 500), before any tool runs."""
    from starlette.testclient import TestClient

    from prefect_baton.errors import UnavailableError
    from prefect_baton.mcp import http_app
    from prefect_baton.rest import keys

    def down(*_args: object) -> None:
        raise UnavailableError("ledger database unavailable")

    monkeypatch.setattr(keys, "authenticate", down)
    with TestClient(http_app(ledger_url), base_url="http://127.0.0.1:8788") as client:
        headers = {**MCP_HEADERS, "Authorization": "Bearer bk_" + "z" * 43}
        resp = client.post("/mcp", json=INITIALIZE, headers=headers)
    assert resp.status_code == 503
    rid = resp.headers["x-request-id"]
    assert resp.json() == {
        "error": {
            "code": "UNAVAILABLE",
            "message": f"the service is unavailable; retry later (request {rid})",
        },
        "meta": {"request_id": rid},
    }


def test_the_modern_protocol_path_also_uses_the_key(http_server: HttpServer) -> None:
    """The package's high-level Client negotiates the 2026-07-28 per-request protocol; its
    calls too act as the key's principal, and a tool error comes back the same way."""
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client

    key = http_server.key("alice")

    async def main() -> None:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http,
            Client(streamable_http_client(http_server.url, http_client=http)) as client,
        ):
            assert client.session.protocol_version == "2026-07-28"
            lease = ok(await client.call_tool("baton_lease_acquire", LEASE))
            assert lease["owner"] == "alice"
            bad = await client.call_tool("baton_lease_acquire", {**LEASE, "x": 1})
            tool_error(bad, "VALIDATION_ERROR")

    run(main)


def _sse_json(resp: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a POST answered as JSON or as one server-sent event."""
    if resp.headers["content-type"].startswith("application/json"):
        return dict(resp.json())
    data = [line[5:].strip() for line in resp.text.splitlines() if line.startswith("data:")]
    return dict(json.loads(next(d for d in data if d)))


def test_http_keeps_no_sessions(http_server: HttpServer) -> None:
    """Each request stands alone (its key decides who calls): ``initialize`` opens no
    session (no ``Mcp-Session-Id``), so thousands of clients leave nothing behind to
    expire, and a call needs no earlier ``initialize``."""
    key = http_server.key("alice")
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {key}"}
    for _ in range(3):
        init = _raw_initialize(http_server.url, f"Bearer {key}")
        assert init.status_code == 200, init.text
        assert "mcp-session-id" not in init.headers
        assert _sse_json(init)["result"]["serverInfo"]["name"] == "prefect-baton"
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "baton_whoami", "arguments": {}},
    }
    resp = httpx.post(http_server.url, json=call, headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    assert "mcp-session-id" not in resp.headers
    assert _sse_json(resp)["result"]["structuredContent"]["principal"] == "alice"


def test_a_malformed_tools_call_envelope_is_invalid_params_over_http(
    http_server: HttpServer,
) -> None:
    """Over HTTP too, a ``tools/call`` with ``arguments`` that is not an object (or a
    ``name`` that is not a string) is the JSON-RPC error ``-32602``, not a tool error."""
    from .test_stdio import MALFORMED_CALLS

    headers = {**MCP_HEADERS, "Authorization": f"Bearer {http_server.key('alice')}"}
    for i, params in enumerate(MALFORMED_CALLS, start=2):
        call = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}
        resp = httpx.post(http_server.url, json=call, headers=headers, timeout=30)
        reply = _sse_json(resp)
        assert reply["id"] == i
        assert reply["error"]["code"] == -32602, reply


BAD_IDS: list[Any] = [1.5, {"a": 1}, True, None]


def test_a_request_with_a_bad_id_is_an_invalid_request_over_http(http_server: HttpServer) -> None:
    """A request whose ``id`` is a fraction, an object, a boolean or null gets ``400`` with
    the JSON-RPC error ``-32600`` (``id`` null), as over stdio, not ``202`` and no answer
    (the ``mcp`` package would take it for a notification); without a key it is still
    ``401`` first."""
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {http_server.key('alice')}"}
    for rid in BAD_IDS:
        body = {"jsonrpc": "2.0", "id": rid, "method": "tools/list"}
        resp = httpx.post(http_server.url, json=body, headers=headers, timeout=30)
        assert resp.status_code == 400, resp.text
        assert resp.json() == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {
                "code": -32600,
                "message": "Invalid Request: id must be a string or an integer",
            },
        }
    body = {"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}
    resp = httpx.post(http_server.url, json=body, headers=MCP_HEADERS, timeout=30)
    assert resp.status_code == 401, resp.text


ENVELOPE_MESSAGES: list[tuple[Any, str]] = [
    ([1], "Invalid params: params: Input should be a valid dictionary"),
    (
        {"name": "baton_whoami", "arguments": [1]},
        "Invalid params: params.arguments: Input should be a valid dictionary",
    ),
    ({"name": 5, "arguments": {}}, "Invalid params: params.name: Input should be a valid string"),
    ({"arguments": {}}, "Invalid params: params.name: Field required"),
]


def test_envelope_errors_over_http_are_short_and_readable(http_server: HttpServer) -> None:
    """``params`` of the wrong shape: ``-32602`` with the request's id and one line naming
    the field and what it must be, without pydantic's report or its documentation URL."""
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {http_server.key('alice')}"}
    before = row_counts(http_server.ledger_url)
    for params, message in ENVELOPE_MESSAGES:
        call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params}
        resp = httpx.post(http_server.url, json=call, headers=headers, timeout=30)
        reply = _sse_json(resp)
        assert reply["id"] == 9, reply
        assert reply["error"] == {"code": -32602, "message": message}
    assert row_counts(http_server.ledger_url) == before


def test_a_refused_notification_is_accepted_with_no_body_over_http(
    http_server: HttpServer,
) -> None:
    """A POST carrying a notification whose params are not an object, or that names a key
    twice, is ``202`` with no body, as the streamable HTTP transport answers every
    notification: JSON-RPC answers no notification, so no error with id null (stdio drops
    it likewise)."""
    from .test_envelope import BAD_NOTIFICATIONS

    headers = {
        **MCP_HEADERS,
        "Authorization": f"Bearer {http_server.key('alice')}",
        "Content-Type": "application/json",
    }
    for text in BAD_NOTIFICATIONS:
        resp = httpx.post(http_server.url, content=text, headers=headers, timeout=30)
        assert (resp.status_code, resp.content) == (202, b""), resp.text


_NOT_UTF8 = "invalid JSON at byte %d (not UTF-8 text)"

#: Bodies that are not JSON text, and the JSON-RPC error (``-32700``, id null) stdio gives
#: the same line.
NOT_JSON: list[tuple[bytes, str]] = [
    (
        b'{"jsonrpc": "2.0", "id": 4, "method": "ping",',
        "invalid JSON at byte 45 (Expecting property name enclosed in double quotes)",
    ),
    (
        b'{"jsonrpc": "2.0", "id": 5, "method": "p\xffing"}',
        "invalid JSON at byte 40 (not UTF-8 text)",
    ),
    (
        b'{"jsonrpc": "2.0", "id": 6, "method": "ping", "params": {"x": NaN}}',
        "invalid JSON at byte 62 (NaN is not a JSON value)",
    ),
    # UTF-16 and UTF-32, which json.loads of bytes would read: not UTF-8 text either
    ('{"jsonrpc": "2.0", "id": 7, "method": "ping"}'.encode("utf-16"), _NOT_UTF8 % 0),
    ('{"jsonrpc": "2.0", "id": 7, "method": "ping"}'.encode("utf-16-le"), _NOT_UTF8 % 1),
    ('{"jsonrpc": "2.0", "id": 7, "method": "ping"}'.encode("utf-32-be"), _NOT_UTF8 % 0),
]


def test_a_body_that_is_not_json_is_a_parse_error_over_http(http_server: HttpServer) -> None:
    """A body that is not JSON text (malformed, not UTF-8, ``NaN``) is ``400`` with the
    JSON-RPC error ``-32700`` and ``id`` null, as stdio answers the same line, not the REST
    API's error envelope."""
    headers = {
        **MCP_HEADERS,
        "Authorization": f"Bearer {http_server.key('alice')}",
        "Content-Type": "application/json",
    }
    for raw, detail in NOT_JSON:
        resp = httpx.post(http_server.url, content=raw, headers=headers, timeout=30)
        assert resp.status_code == 400, resp.text
        expected = {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32700, "message": f"Parse error: {detail}"},
        }
        assert resp.json() == expected
        stdio = read_bytes(raw)
        assert isinstance(stdio, Refusal)
        assert stdio.model_dump(mode="json", by_alias=True, exclude_unset=True) == expected


def test_a_trailing_slash_is_not_redirected_over_http(http_server: HttpServer) -> None:
    """``/mcp/`` is ``404``, not a ``307`` to ``/mcp`` on whatever ``Host`` the client sent."""
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {http_server.key('alice')}"}
    call = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    resp = httpx.post(http_server.url + "/", json=call, headers=headers, timeout=30)
    assert resp.status_code == 404, (resp.status_code, resp.headers)
    assert "location" not in resp.headers


def test_a_body_of_too_many_containers_is_413_over_http(http_server: HttpServer) -> None:
    """A body holding more JSON objects and arrays than the limit (557,056 by default) is
    ``413 PAYLOAD_TOO_LARGE`` before it is parsed, as by the REST API, and the server
    answers the next request."""
    from prefect_baton.rest._http import MAX_BODY_CONTAINERS

    headers = {
        **MCP_HEADERS,
        "Authorization": f"Bearer {http_server.key('alice')}",
        "Content-Type": "application/json",
    }
    arrays = b"[" + b",".join([b"[]"] * MAX_BODY_CONTAINERS) + b"]"
    raw = (
        b'{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": '
        b'"baton_whoami", "arguments": {"x": ' + arrays + b"}}}"
    )
    resp = httpx.post(http_server.url, content=raw, headers=headers, timeout=60)
    assert resp.status_code == 413, resp.text[:300]
    assert resp.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    ping = {"jsonrpc": "2.0", "id": 9, "method": "ping"}
    resp = httpx.post(http_server.url, json=ping, headers=headers, timeout=30)
    assert _sse_json(resp) == {"jsonrpc": "2.0", "id": 9, "result": {}}


def test_nan_is_a_parse_error_over_http(http_server: HttpServer) -> None:
    """A body with ``NaN`` (not JSON, though Python reads it) is refused with ``400``."""
    headers = {
        **MCP_HEADERS,
        "Authorization": f"Bearer {http_server.key('alice')}",
        "Content-Type": "application/json",
    }
    text = '{"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"x": NaN}}'
    resp = httpx.post(http_server.url, content=text, headers=headers, timeout=30)
    assert resp.status_code == 400, resp.text
    assert "NaN" in resp.text


def test_a_clients_error_response_is_accepted_like_a_result_over_http(
    http_server: HttpServer,
) -> None:
    """A POST carrying a JSON-RPC error response of the client (``id`` and ``error``) is a
    response like one with ``result``: ``202`` with no body, not echoed back as a ``400``;
    a lone surrogate in a request's ``id`` is ``400`` ``-32700`` with id null, as over
    stdio."""
    headers = {
        **MCP_HEADERS,
        "Authorization": f"Bearer {http_server.key('alice')}",
        "Content-Type": "application/json",
    }
    for text in [
        '{"jsonrpc": "2.0", "id": 61, "error": {"code": 1, "message": "x"}}',
        '{"jsonrpc": "2.0", "id": 62, "result": {}}',
    ]:
        resp = httpx.post(http_server.url, content=text, headers=headers, timeout=30)
        assert (resp.status_code, resp.content) == (202, b""), resp.text
    text = '{"jsonrpc": "2.0", "id": "\\ud800", "method": "ping"}'
    resp = httpx.post(http_server.url, content=text, headers=headers, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.json()["id"] is None
    assert resp.json()["error"]["code"] == -32700
