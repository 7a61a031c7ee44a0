"""``baton mcp`` over stdio, driven by the ``mcp`` package's own client session: each
client is a ``baton mcp`` subprocess acting as the principal it was started with."""

from __future__ import annotations

import json
import subprocess
from contextlib import AsyncExitStack
from typing import Any

from mcp.client.session import ClientSession

from tests.conftest import INITIALIZE

from .conftest import BATON, LEASE, ok, race, row_counts, run, tool_error

TOOL_NAMES = {
    "baton_lease_acquire",
    "baton_lease_renew",
    "baton_lease_release",
    "baton_lease_inspect",
    "baton_checkpoint_save",
    "baton_checkpoint_get",
    "baton_handoff_create",
    "baton_handoff_inbox",
    "baton_handoff_resolve",
    "baton_handoff_show",
    "baton_outcome_record",
    "baton_lease_transfer",
    "baton_lease_force_release",
    "baton_lease_acquire_many",
    "baton_lease_list",
    "baton_event_list",
    "baton_checkpoint_history",
    "baton_checkpoint_delete",
    "baton_outcome_list",
    "baton_whoami",
    # the seed service's names (tests/mcp/test_tools_more.py)
    "titen_lease_acquire",
    "titen_checkpoint_save",
    "titen_checkpoint_get",
    "titen_handoff",
}


def test_lists_the_coordination_tools(stdio_session: Any) -> None:
    """The server lists every coordination tool; each input schema forbids unknown fields
    and each declares an output schema (which the client session checks every result
    against)."""

    async def main() -> None:
        async with stdio_session("agent-a") as s:
            listed = (await s.list_tools()).tools
            assert {t.name for t in listed} == TOOL_NAMES
            for tool in listed:
                assert tool.input_schema["type"] == "object"
                assert tool.input_schema["additionalProperties"] is False, tool.name
                assert tool.output_schema is not None
                assert tool.output_schema["type"] == "object", tool.name
                assert tool.description
            by_name = {t.name: t for t in listed}
            assert by_name["baton_lease_inspect"].annotations.read_only_hint is True
            assert by_name["baton_lease_acquire"].annotations.read_only_hint is False

    run(main)


def test_two_clients_race_for_one_lease(stdio_session: Any, ledger_url: str) -> None:
    """Two clients acquire one resource at once: exactly one wins, the other gets a
    CONFLICT tool error naming only the expiry, and cannot release the winner's lease."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(stdio_session("agent-a"))
            b = await stack.enter_async_context(stdio_session("agent-b"))
            sessions: list[ClientSession] = [a, b]

            def acquire(s: ClientSession) -> Any:
                return lambda: s.call_tool("baton_lease_acquire", dict(LEASE, purpose="rollback"))

            results = await race([acquire(s) for s in sessions])
            winners = [i for i, r in enumerate(results) if not r.is_error]
            assert len(winners) == 1
            w = winners[0]
            lease = ok(results[w])
            assert lease["owner"] == ["agent-a", "agent-b"][w]
            assert lease["epoch"] == 1
            err = tool_error(results[1 - w], "CONFLICT")
            assert "expires_at" in err
            for secret in ("agent-a", "agent-b", "rollback"):
                assert secret not in err["message"]
            loser = sessions[1 - w]
            release = await loser.call_tool("baton_lease_release", {"lease_id": lease["lease_id"]})
            tool_error(release, "NOT_FOUND")
            mine = await sessions[w].call_tool(
                "baton_lease_release", {"lease_id": lease["lease_id"]}
            )
            assert ok(mine)["status"] == "released"

    run(main)
    assert row_counts(ledger_url)["baton_leases"] == 1


def test_handoff_created_by_one_is_resolved_by_the_other(stdio_session: Any) -> None:
    """A handoff carrying a checkpoint and a lease is in the recipient's inbox (not the
    sender's); accepting it there moves the lease, so the sender's fence goes stale."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            alice = await stack.enter_async_context(stdio_session("alice"))
            bob = await stack.enter_async_context(stdio_session("bob"))
            lease = ok(await alice.call_tool("baton_lease_acquire", LEASE))
            fence = {"lease_id": lease["lease_id"], "epoch": lease["epoch"]}
            ckpt = ok(
                await alice.call_tool(
                    "baton_checkpoint_save",
                    {"subject_id": "svc", "kind": "rollback", "state": {"step": 2}, **fence},
                )
            )
            handoff = ok(
                await alice.call_tool(
                    "baton_handoff_create",
                    {
                        "to_principal": "bob",
                        "subject_id": "svc",
                        "checkpoint_id": ckpt["checkpoint_id"],
                        "lease_id": lease["lease_id"],
                        "message": "step 2 done",
                    },
                )
            )
            assert handoff["status"] == "pending"
            assert ok(await alice.call_tool("baton_handoff_inbox", {})) == {
                "handoffs": [],
                "next_cursor": None,
            }
            inbox = ok(await bob.call_tool("baton_handoff_inbox", {}))["handoffs"]
            assert [h["handoff_id"] for h in inbox] == [handoff["handoff_id"]]
            assert inbox[0]["from_principal"] == "alice"

            tool_error(
                await alice.call_tool(
                    "baton_handoff_resolve",
                    {"handoff_id": handoff["handoff_id"], "status": "accepted"},
                ),
                "VALIDATION_ERROR",
            )
            accepted = ok(
                await bob.call_tool(
                    "baton_handoff_resolve",
                    {"handoff_id": handoff["handoff_id"], "status": "accepted"},
                )
            )
            assert accepted["status"] == "accepted"
            moved = accepted["lease"]
            assert moved["owner"] == "bob"
            assert moved["epoch"] == lease["epoch"] + 1
            again = await bob.call_tool(
                "baton_handoff_resolve", {"handoff_id": handoff["handoff_id"], "status": "rejected"}
            )
            tool_error(again, "NOT_FOUND")
            assert ok(await bob.call_tool("baton_handoff_inbox", {})) == {
                "handoffs": [],
                "next_cursor": None,
            }
            shown = ok(
                await alice.call_tool("baton_handoff_show", {"handoff_id": handoff["handoff_id"]})
            )
            assert shown["status"] == "accepted"

            stale = await alice.call_tool(
                "baton_checkpoint_save",
                {"subject_id": "svc", "kind": "rollback", "state": {"step": 3}, **fence},
            )
            tool_error(stale, "STALE_FENCE")
            read = ok(
                await bob.call_tool(
                    "baton_checkpoint_get", {"checkpoint_id": ckpt["checkpoint_id"]}
                )
            )
            assert read["state"] == {"step": 2}
            outcome = ok(
                await bob.call_tool(
                    "baton_outcome_record",
                    {
                        "subject_id": "svc",
                        "status": "succeeded",
                        "evidence": [{"kind": "log", "uri": "https://ci.example/run/42"}],
                        "lease_id": moved["lease_id"],
                        "epoch": moved["epoch"],
                        "handoff_id": handoff["handoff_id"],
                        "checkpoint_id": ckpt["checkpoint_id"],
                    },
                )
            )
            assert outcome["principal"] == "bob"
            released = ok(
                await bob.call_tool("baton_lease_release", {"lease_id": moved["lease_id"]})
            )
            assert released["status"] == "released"

    run(main)


def test_lease_lifecycle_renew_inspect_release(stdio_session: Any) -> None:
    """Renew keeps id and epoch; inspect shows the holder its lease; a second release is
    no_change; renewing a released lease is LEASE_LOST; a wrong epoch fence is STALE_FENCE."""

    async def main() -> None:
        async with stdio_session("agent-a") as s:
            lease = ok(await s.call_tool("baton_lease_acquire", LEASE))
            renewed = ok(
                await s.call_tool(
                    "baton_lease_renew", {"lease_id": lease["lease_id"], "ttl_seconds": 900}
                )
            )
            assert (renewed["lease_id"], renewed["epoch"]) == (lease["lease_id"], lease["epoch"])
            assert renewed["version"] == lease["version"] + 1
            assert renewed["ttl_seconds"] == 900
            info = ok(
                await s.call_tool(
                    "baton_lease_inspect",
                    {"resource_type": LEASE["resource_type"], "resource_id": LEASE["resource_id"]},
                )
            )
            assert info["held"] is True
            assert info["lease"]["lease_id"] == lease["lease_id"]
            wrong = await s.call_tool(
                "baton_checkpoint_save",
                {
                    "subject_id": "svc",
                    "kind": "k",
                    "state": {},
                    "lease_id": lease["lease_id"],
                    "epoch": lease["epoch"] + 1,
                },
            )
            tool_error(wrong, "STALE_FENCE")
            first = ok(await s.call_tool("baton_lease_release", {"lease_id": lease["lease_id"]}))
            assert first["status"] == "released"
            second = ok(await s.call_tool("baton_lease_release", {"lease_id": lease["lease_id"]}))
            assert second["status"] == "no_change"
            lost = await s.call_tool("baton_lease_renew", {"lease_id": lease["lease_id"]})
            tool_error(lost, "LEASE_LOST")
            missing = await s.call_tool(
                "baton_checkpoint_get", {"subject_id": "nothing", "kind": "here"}
            )
            tool_error(missing, "NOT_FOUND")

    run(main)


BAD_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("baton_lease_acquire", {**LEASE, "holder": "someone-else"}),
    ("baton_lease_acquire", {**LEASE, "ttl_seconds": "600"}),
    ("baton_lease_acquire", {**LEASE, "ttl_seconds": 5}),
    ("baton_lease_acquire", {"resource_type": "deploy", "ttl_seconds": 600}),
    ("baton_checkpoint_save", {"subject_id": "s", "kind": "k", "state": {}, "principal": "bob"}),
    ("baton_checkpoint_save", {"subject_id": "s", "kind": "k", "state": [1]}),
    ("baton_checkpoint_save", {"subject_id": "s", "kind": "k", "state": {}, "lease_id": "x"}),
    ("baton_handoff_create", {"to_principal": "bob", "subject_id": "s", "priority": 1}),
    ("baton_handoff_create", {"to_principal": "agent-a", "subject_id": "s"}),
    ("baton_handoff_resolve", {"handoff_id": "h", "status": "maybe"}),
    ("baton_outcome_record", {"subject_id": "s", "status": "succeeded", "evidence": []}),
    (
        "baton_outcome_record",
        {"subject_id": "s", "status": "failed", "evidence": [{"kind": "a", "uri": "b", "x": 1}]},
    ),
    ("baton_checkpoint_get", {"subject_id": "s"}),
    ("baton_handoff_inbox", {"limit": 0}),
]


def test_bad_arguments_are_validation_errors_and_write_nothing(
    stdio_session: Any, ledger_url: str
) -> None:
    """Unknown fields, wrong types, out-of-range values and bad combinations are tool
    errors with VALIDATION_ERROR, and the ledger is unchanged."""
    before = row_counts(ledger_url)

    async def main() -> None:
        async with stdio_session("agent-a") as s:
            for name, args in BAD_CALLS:
                err = tool_error(await s.call_tool(name, args), "VALIDATION_ERROR")
                assert err["message"], (name, args)
            unknown = await s.call_tool("baton_no_such_tool", {})
            tool_error(unknown, "NOT_FOUND")

    run(main)
    assert row_counts(ledger_url) == before


def test_validation_messages_name_the_problem(stdio_session: Any) -> None:
    """The VALIDATION_ERROR of an unknown field names it; that of an id with a control
    character says so in words (the REST API's messages), not as a regular expression."""

    async def main() -> None:
        async with stdio_session("agent-a") as s:
            unknown = tool_error(
                await s.call_tool("baton_lease_acquire", {**LEASE, "holder": "x"}),
                "VALIDATION_ERROR",
            )
            assert "holder" in unknown["message"]
            control = tool_error(
                await s.call_tool("baton_lease_acquire", {**LEASE, "resource_id": "a\x01b"}),
                "VALIDATION_ERROR",
            )
            assert "control characters" in control["message"]
            assert "^[" not in control["message"]

    run(main)


def test_stdio_acts_as_the_configured_principal(stdio_session: Any, org: str) -> None:
    """Over stdio the owner is the --principal the server was started with, and another
    org's client sees nothing of this org's leases."""

    async def main() -> None:
        async with stdio_session("carol", role="owner") as s:
            lease = ok(await s.call_tool("baton_lease_acquire", LEASE))
            assert lease["owner"] == "carol"
        async with stdio_session("carol", org_=org + "-other") as other:
            info = ok(
                await other.call_tool(
                    "baton_lease_inspect",
                    {"resource_type": LEASE["resource_type"], "resource_id": LEASE["resource_id"]},
                )
            )
            assert info["held"] is False
            tool_error(
                await other.call_tool("baton_lease_release", {"lease_id": lease["lease_id"]}),
                "NOT_FOUND",
            )

    run(main)


def test_a_bad_ledger_url_exits_before_serving() -> None:
    """`baton mcp` with a malformed ledger URL exits 2 with VALIDATION_ERROR on stderr and
    writes nothing to stdout (the protocol channel)."""
    proc = subprocess.run(
        [BATON, "--ledger-url", "bogus://x", "mcp"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "VALIDATION_ERROR" in proc.stderr


def test_unreadable_lines_get_a_json_rpc_error_and_the_server_goes_on(ledger_url: str) -> None:
    """A stdin line that is not JSON gets ``-32700`` and a JSON value that is not a
    JSON-RPC message ``-32600``, both with ``id`` null (JSON-RPC 2.0: the id could not be
    read), so a client does not wait for an answer that never comes; blank lines get none;
    the next good request is answered as usual."""
    lines = [
        "not json",
        "",
        "   ",
        '{"jsonrpc": "2.0", "id": 7, "method": 5}',
        "[1, 2]",
        '{"jsonrpc": "2.0", "id": 8, "method": "tools/list"',
        json.dumps(INITIALIZE),
    ]
    proc = subprocess.run(
        [BATON, "--ledger-url", ledger_url, "mcp"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    replies = [json.loads(line) for line in proc.stdout.splitlines()]
    codes = [r["error"]["code"] for r in replies[:-1]]
    assert codes == [-32700, -32600, -32600, -32700]
    assert all(r["id"] is None and r["jsonrpc"] == "2.0" for r in replies[:-1])
    assert replies[0]["error"]["message"].startswith("Parse error: ")
    assert replies[1]["error"]["message"].startswith("Invalid Request: ")
    assert replies[-1]["id"] == 1
    assert replies[-1]["result"]["serverInfo"]["name"] == "prefect-baton"


INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def _call_line(rid: int, name: str, arguments: dict[str, Any]) -> bytes:
    msg = {"jsonrpc": "2.0", "id": rid, "method": "tools/call"}
    msg["params"] = {"name": name, "arguments": arguments}
    return json.dumps(msg).encode()


def _piped(ledger_url: str, *lines: bytes) -> dict[Any, dict[str, Any]]:
    """The replies of ``baton mcp`` to ``initialize``, ``initialized`` and ``lines`` on
    its stdin (then closed), by id (``None``: the list of replies with id null); the
    process must exit 0 and write only JSON lines."""
    head = [json.dumps(INITIALIZE).encode(), json.dumps(INITIALIZED).encode()]
    proc = subprocess.run(
        [BATON, "--ledger-url", ledger_url, "--org", "acme", "--principal", "a", "mcp"],
        input=b"\n".join([*head, *lines]) + b"\n",
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    replies: dict[Any, Any] = {None: []}
    for line in proc.stdout.decode("utf-8").splitlines():
        reply = json.loads(line)
        if reply["id"] is None:
            replies[None].append(reply)
        else:
            assert reply["id"] not in replies, reply
            replies[reply["id"]] = reply
    assert replies[1]["result"]["serverInfo"]["name"] == "prefect-baton"
    return replies


def test_every_call_read_before_stdin_ends_is_answered(ledger_url: str) -> None:
    """``printf '<initialize>\\n<initialized>\\n<calls>\\n' | baton mcp``: the server
    stops only once the calls it has read are answered, so no lease is taken without its
    reply reaching the client."""
    lines = [
        _call_line(i, "baton_lease_acquire", {**LEASE, "resource_id": f"svc-{i}"})
        for i in range(2, 6)
    ]
    replies = _piped(ledger_url, *lines)
    assert sorted(k for k in replies if k is not None) == [1, 2, 3, 4, 5]
    for i in range(2, 6):
        result = replies[i]["result"]
        assert result["isError"] is False, result
        assert result["structuredContent"]["resource_id"] == f"svc-{i}"
    assert replies[None] == []
    assert row_counts(ledger_url)["baton_leases"] == 4


def test_a_line_that_is_not_utf8_is_a_parse_error(ledger_url: str) -> None:
    """A stdin line with bytes that are not UTF-8 is refused with ``-32700`` naming the
    byte offset (``id`` null), not read with U+FFFD in their place (which would make
    ``x\\xff`` and ``x\\xfe`` one resource id); nothing is written and the next line is
    served."""
    bad = _call_line(2, "baton_lease_acquire", {**LEASE, "resource_id": "x#"})
    bad = bad.replace(b"x#", b"x\xff")
    good = _call_line(3, "baton_lease_acquire", {**LEASE, "resource_id": "x\ufffd"})
    replies = _piped(ledger_url, bad, good)
    assert 2 not in replies
    [refused] = replies[None]
    assert refused["error"]["code"] == -32700
    at = bad.index(b"\xff")
    assert refused["error"]["message"] == f"Parse error: invalid JSON at byte {at} (not UTF-8 text)"
    assert replies[3]["result"]["isError"] is False
    assert row_counts(ledger_url)["baton_leases"] == 1


def test_a_key_given_twice_is_an_invalid_request(ledger_url: str) -> None:
    """A message naming a key twice in one object is refused with ``-32600`` and the
    REST API's words (JSON would keep the last value silently, so ``ttl_seconds`` 60 then
    5 would lease for 5 s): with the request's id when that is given once, else id null;
    nothing is written."""
    twice = _call_line(2, "baton_lease_acquire", LEASE).replace(
        b'"ttl_seconds": 600', b'"ttl_seconds": 600, "ttl_seconds": 5'
    )
    two_ids = b'{"jsonrpc": "2.0", "id": 3, "id": 4, "method": "tools/list"}'
    replies = _piped(ledger_url, twice, two_ids)
    err = replies[2]["error"]
    assert err["code"] == -32600
    assert "the key 'ttl_seconds' appears twice in one object" in err["message"]
    [null] = replies[None]
    assert null["error"]["code"] == -32600
    assert "the key 'id' appears twice in one object" in null["error"]["message"]
    assert set(replies) == {None, 1, 2}
    assert row_counts(ledger_url)["baton_leases"] == 0


MALFORMED_CALLS: list[dict[str, Any]] = [
    {"name": "baton_whoami", "arguments": [1]},
    {"name": 5, "arguments": {}},
    {"arguments": {}},
]


def test_a_malformed_tools_call_envelope_is_invalid_params(ledger_url: str) -> None:
    """A ``tools/call`` whose ``name`` is not a string or whose ``arguments`` is not an
    object reaches no tool: it is answered ``-32602`` with its id and one line naming the
    field (not a ``VALIDATION_ERROR`` tool error, which is about the arguments' contents,
    as docs/mcp.md says)."""
    lines = [
        json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}).encode()
        for i, params in enumerate(MALFORMED_CALLS, start=2)
    ]
    before = row_counts(ledger_url)
    replies = _piped(ledger_url, *lines)
    for i in range(2, 2 + len(MALFORMED_CALLS)):
        assert replies[i]["error"]["code"] == -32602, replies[i]
    assert [replies[i]["error"]["message"] for i in (2, 3, 4)] == [
        "Invalid params: params.arguments: Input should be a valid dictionary",
        "Invalid params: params.name: Input should be a valid string",
        "Invalid params: params.name: Field required",
    ]
    assert row_counts(ledger_url) == before


def test_a_request_whose_id_is_not_a_string_or_integer_is_an_invalid_request(
    ledger_url: str,
) -> None:
    """A request whose ``id`` is null, an object, a fraction or a boolean gets ``-32600``
    (``id`` null) instead of being taken for a notification and answered with nothing."""
    bad_ids: list[Any] = [None, {"a": 1}, 1.5, True]
    lines = [
        json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/list"}).encode()
        for rid in bad_ids
    ]
    good = json.dumps({"jsonrpc": "2.0", "id": "s", "method": "tools/list"}).encode()
    replies = _piped(ledger_url, *lines, good)
    assert [r["error"]["code"] for r in replies[None]] == [-32600] * len(bad_ids)
    assert all(
        r["error"]["message"] == "Invalid Request: id must be a string or an integer"
        for r in replies[None]
    )
    assert len(replies["s"]["result"]["tools"]) == len(TOOL_NAMES)


def test_a_refused_notification_gets_no_reply(ledger_url: str) -> None:
    """A notification (a method, no id) with params that are not an object, or a key
    given twice, is never answered (JSON-RPC 2.0): no error line with id null on stdout;
    the next request is served."""
    from .test_envelope import BAD_NOTIFICATIONS

    good = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).encode()
    replies = _piped(ledger_url, *(n.encode() for n in BAD_NOTIFICATIONS), good)
    assert replies[None] == []
    assert len(replies[2]["result"]["tools"]) == len(TOOL_NAMES)


def test_nan_is_a_parse_error(ledger_url: str) -> None:
    """A line with ``NaN``, ``Infinity`` or ``-Infinity`` (not JSON, though Python reads
    them) is answered ``-32700`` with id null and reaches no tool; nothing is written."""
    lines = [
        _call_line(i, "baton_lease_acquire", {**LEASE, "ttl_seconds": 600}).replace(b"600", literal)
        for i, literal in enumerate([b"NaN", b"Infinity", b"-Infinity"], start=2)
    ]
    replies = _piped(ledger_url, *lines)
    assert [r["error"]["code"] for r in replies[None]] == [-32700] * 3
    assert set(replies) == {None, 1}
    assert row_counts(ledger_url)["baton_leases"] == 0


def test_a_lone_surrogate_is_a_parse_error_and_the_server_goes_on(ledger_url: str) -> None:
    """A line whose ``id``, ``method`` or any other string holds a lone surrogate
    (``"\\ud800"``: not Unicode text, so it cannot be echoed in UTF-8) is answered
    ``-32700`` with id null, as over HTTP, and the next request is answered; the server
    exits 0."""
    lines = [
        b'{"jsonrpc": "2.0", "id": "\\ud800", "method": "ping"}',
        b'{"jsonrpc": "2.0", "id": 24, "method": "x\\ud800"}',
        b'{"jsonrpc": "2.0", "id": 25, "method": "ping", "params": {"\\udc00": 1, "\\udc00": 2}}',
        b'{"jsonrpc": "2.0", "id": 22, "method": "ping"}',
    ]
    replies = _piped(ledger_url, *lines)
    assert [r["error"]["code"] for r in replies[None]] == [-32700] * 3
    assert all("lone surrogate" in r["error"]["message"] for r in replies[None])
    assert replies[22]["result"] == {}
    assert set(replies) == {None, 1, 22}


def test_a_clients_error_response_is_not_echoed(ledger_url: str) -> None:
    """A JSON-RPC error response the client sends (``id`` and ``error``) is a response,
    like one with ``result``: it is not written back to the client as if it answered the
    client's request of that id; that request gets its own answer."""
    lines = [
        b'{"jsonrpc": "2.0", "id": 5, "method": "ping"}',
        b'{"jsonrpc": "2.0", "id": 5, "error": {"code": -32000, "message": "client says no"}}',
        b'{"jsonrpc": "2.0", "id": 6, "error": {"code": -32000, "message": "client says no"}}',
    ]
    replies = _piped(ledger_url, *lines)
    assert replies[5] == {"jsonrpc": "2.0", "id": 5, "result": {}}
    assert set(replies) == {None, 1, 5}
    assert replies[None] == []
