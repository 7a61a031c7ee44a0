"""The tools an agent host needs besides the core loop (transfer, force release,
acquire_many, your own leases, the event stream, checkpoint history, outcomes, who am I)
and the seed service's tool names with its argument names, each over stdio and over HTTP
through the ``mcp`` package's client session (which checks every result against the
tool's output schema)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
from mcp.client.session import ClientSession

from prefect_baton._rules.handoffs import STATUS_NEEDS_PARTY

from .conftest import HttpServer, ok, run, tool_error
from .test_stdio import TOOL_NAMES

Open = Callable[..., AbstractAsyncContextManager[ClientSession]]


@pytest.fixture(params=["stdio", "http"])
def open_session(request: pytest.FixtureRequest) -> Open:
    """``async with open_session("agent-a", role="agent") as s``: a session of that
    principal over stdio (``baton mcp``) or over HTTP (a bearer key of that principal)."""
    if request.param == "stdio":
        stdio: Any = request.getfixturevalue("stdio_session")
        return stdio  # type: ignore[no-any-return]
    server: HttpServer = request.getfixturevalue("http_server")

    @asynccontextmanager
    async def open_http(principal: str, *, role: str = "agent") -> AsyncIterator[ClientSession]:
        async with server.session(server.key(principal, role=role)) as s:
            yield s

    return open_http


def test_every_tool_has_input_and_output_schemas(open_session: Open) -> None:
    """Every tool, the seed's names included, is listed with an input schema that forbids
    unknown fields and an output schema."""

    async def main() -> None:
        async with open_session("agent-a") as s:
            listed = {t.name: t for t in (await s.list_tools()).tools}
            assert set(listed) == TOOL_NAMES
            for tool in listed.values():
                assert tool.input_schema["type"] == "object", tool.name
                assert tool.input_schema["additionalProperties"] is False, tool.name
                assert tool.output_schema is not None, tool.name
                assert tool.output_schema["type"] == "object", tool.name
            for name in ("baton_lease_list", "baton_event_list", "baton_whoami"):
                assert listed[name].annotations.read_only_hint is True
            seed_get = listed["titen_checkpoint_get"].input_schema
            assert {"subject_id", "kind", "agent_id"} <= set(seed_get["properties"])
            assert "principal" not in seed_get["properties"]
            assert "required" not in seed_get  # as baton_checkpoint_get
            seed_save = listed["titen_checkpoint_save"].input_schema
            assert {"agent_id", "run_id"} <= set(seed_save["properties"])

    run(main)


def test_leases_transfer_force_release_and_paging(open_session: Open) -> None:
    """acquire_many, whoami, the caller's own leases paged by cursor (a lost lease_id is
    found there), transfer, and force release refused to an agent but done by an owner
    (forced: true)."""

    async def main() -> None:
        async with open_session("agent-a") as a, open_session("boss", role="owner") as boss:
            me = ok(await a.call_tool("baton_whoami", {}))
            assert (me["principal"], me["role"]) == ("agent-a", "agent")
            assert me["state_max_bytes"] > 0
            batch = {
                "resources": [
                    {"resource_type": "deploy", "resource_id": "one"},
                    {"resource_type": "deploy", "resource_id": "two"},
                    {"resource_type": "deploy", "resource_id": "three"},
                ],
                "ttl_seconds": 600,
            }
            leases = ok(await a.call_tool("baton_lease_acquire_many", batch))["leases"]
            assert [x["resource_id"] for x in leases] == ["one", "two", "three"]
            ids = {x["lease_id"] for x in leases}
            seen: list[str] = []
            cursor = None
            for _ in range(4):
                args: dict[str, Any] = {"limit": 2}
                if cursor is not None:
                    args["cursor"] = cursor
                page = ok(await a.call_tool("baton_lease_list", args))
                seen += [x["lease_id"] for x in page["leases"]]
                cursor = page["next_cursor"]
                if cursor is None:
                    break
            assert len(seen) == 3
            assert set(seen) == ids
            bad = await a.call_tool("baton_lease_list", {"cursor": "c1.nonsense"})
            tool_error(bad, "VALIDATION_ERROR")

            moved = ok(
                await a.call_tool(
                    "baton_lease_transfer",
                    {
                        "lease_id": leases[0]["lease_id"],
                        "to_principal": "agent-b",
                        "new_execution_key": "exec-b",
                        "ttl_seconds": 600,
                    },
                )
            )
            assert moved["owner"] == "agent-b"
            assert moved["epoch"] == leases[0]["epoch"] + 1

            target = {"lease_id": leases[1]["lease_id"]}
            tool_error(await a.call_tool("baton_lease_force_release", target), "FORBIDDEN")
            receipt = ok(await boss.call_tool("baton_lease_force_release", target))
            assert receipt["forced"] is True
            assert receipt["action"] == "force_release"
            assert receipt["lease"]["status"] == "revoked"
            left = ok(await a.call_tool("baton_lease_list", {}))["leases"]
            assert [x["resource_id"] for x in left] == ["three"]

    run(main)


def test_events_history_outcomes_and_seed_names(open_session: Open) -> None:
    """The seed's tool names with the seed's argument names (``agent_id``, ``run_id``)
    reach the same tools; checkpoint history, the outcome list and the event stream paged
    by cursor show what they wrote, and a cursor of another list is VALIDATION_ERROR."""

    async def main() -> None:
        async with open_session("agent-a") as a, open_session("agent-b") as b:
            lease = ok(
                await a.call_tool(
                    "titen_lease_acquire",
                    {
                        "resource_type": "deploy",
                        "resource_id": "checkout-service",
                        "purpose": "run rollback smoke",
                        "ttl_seconds": 600,
                    },
                )
            )
            assert lease["lease_id"].startswith("lease_")
            conflict = await b.call_tool(
                "titen_lease_acquire",
                {"resource_type": "deploy", "resource_id": "checkout-service", "ttl_seconds": 600},
            )
            assert tool_error(conflict, "CONFLICT")["expires_at"].endswith("Z")
            for step in (1, 2):
                saved = ok(
                    await a.call_tool(
                        "titen_checkpoint_save",
                        {
                            "subject_id": "user_rama",
                            "kind": "task_state",
                            "state": {"step": step},
                            "ttl_seconds": 600,
                            "agent_id": "agent-a",
                            "run_id": "run-1",
                        },
                    )
                )
            got = ok(  # its writer reads it (another agent may not until a handoff carries it)
                await a.call_tool(
                    "titen_checkpoint_get",
                    {"subject_id": "user_rama", "kind": "task_state", "agent_id": "agent-a"},
                )
            )
            assert got["state"] == {"step": 2}
            history = ok(
                await a.call_tool(
                    "baton_checkpoint_history", {"subject_id": "user_rama", "kind": "task_state"}
                )
            )
            assert [c["version"] for c in history["checkpoints"]] == [1, 2]
            handoff = ok(
                await a.call_tool(
                    "titen_handoff",
                    {
                        "to_principal": "agent-b",
                        "subject_id": "user_rama",
                        "checkpoint_id": saved["checkpoint_id"],
                        "message": "Smoke passed, needs approval to promote.",
                    },
                )
            )
            assert handoff["status"] == "pending"
            delete = {"checkpoint_id": saved["checkpoint_id"]}
            carried = await a.call_tool("baton_checkpoint_delete", delete)
            assert handoff["handoff_id"] in tool_error(carried, "CONFLICT")["message"]
            tool_error(await b.call_tool("baton_checkpoint_delete", delete), "FORBIDDEN")
            inbox = ok(await b.call_tool("baton_handoff_inbox", {"limit": 1}))
            assert [h["handoff_id"] for h in inbox["handoffs"]] == [handoff["handoff_id"]]
            assert inbox["next_cursor"] is None  # the one handoff: nothing follows

            evidence = [{"kind": "log", "uri": "file:///smoke.log"}]
            ok(
                await a.call_tool(
                    "baton_outcome_record",
                    {"subject_id": "user_rama", "status": "succeeded", "evidence": evidence},
                )
            )
            outcomes = ok(await b.call_tool("baton_outcome_list", {"subject_id": "user_rama"}))
            assert [o["status"] for o in outcomes["outcomes"]] == ["succeeded"]

            kinds: list[str] = []
            seqs: list[int] = []
            args: dict[str, Any] = {"limit": 2}
            while True:
                page = ok(await a.call_tool("baton_event_list", args))
                kinds += [e["kind"] for e in page["events"]]
                seqs += [e["seq"] for e in page["events"]]
                if page["next_cursor"] is None:
                    break
                args = {"limit": 2, "cursor": page["next_cursor"]}
            assert seqs == sorted(set(seqs))
            assert kinds == [
                "lease.acquired",
                "checkpoint.saved",
                "checkpoint.saved",
                "handoff.created",
                "outcome.recorded",
            ]
            both = await a.call_tool("baton_event_list", {"after": 1, "cursor": args["cursor"]})
            tool_error(both, "VALIDATION_ERROR")
            other = {"resource_type": "deploy", "resource_id": "other", "ttl_seconds": 60}
            ok(await a.call_tool("baton_lease_acquire", other))
            leases_cursor = ok(await a.call_tool("baton_lease_list", {"limit": 1}))["next_cursor"]
            assert leases_cursor is not None
            wrong = await a.call_tool("baton_event_list", {"cursor": leases_cursor})
            tool_error(wrong, "VALIDATION_ERROR")

            for status in ("failed", "cancelled"):
                record = {"subject_id": "user_rama", "status": status}
                ok(await a.call_tool("baton_outcome_record", record))
            listed = ok(await b.call_tool("baton_outcome_list", {"subject_id": "user_rama"}))
            paged: list[str] = []
            args = {"subject_id": "user_rama", "limit": 2}
            while True:
                page = ok(await b.call_tool("baton_outcome_list", args))
                paged += [o["outcome_id"] for o in page["outcomes"]]
                if page["next_cursor"] is None:
                    break
                args = {"subject_id": "user_rama", "limit": 2, "cursor": page["next_cursor"]}
            assert paged == [o["outcome_id"] for o in listed["outcomes"]]
            assert len(paged) == 3
            for bad in ("c1.nonsense", leases_cursor):
                wrong = await b.call_tool("baton_outcome_list", {"cursor": bad})
                tool_error(wrong, "VALIDATION_ERROR")
            clash = await b.call_tool(
                "titen_checkpoint_get",
                {"subject_id": "s", "kind": "k", "agent_id": "a", "principal": "a"},
            )
            tool_error(clash, "VALIDATION_ERROR")

    run(main)


def test_handoff_inbox_by_party(open_session: Open) -> None:
    """``baton_handoff_inbox`` with ``party: '*'`` lists everyone's pending handoffs to an
    owner (status filtered), is FORBIDDEN to an agent, and ``status`` without ``party`` is
    VALIDATION_ERROR."""

    async def main() -> None:
        async with (
            open_session("agent-a") as a,
            open_session("agent-c") as c,
            open_session("boss", role="owner") as boss,
        ):
            made = ok(
                await c.call_tool(
                    "baton_handoff_create", {"to_principal": "agent-d", "subject_id": "s"}
                )
            )
            everyone = ok(await boss.call_tool("baton_handoff_inbox", {"party": "*"}))
            assert [h["handoff_id"] for h in everyone["handoffs"]] == [made["handoff_id"]]
            accepted = {"party": "*", "status": "accepted"}
            assert ok(await boss.call_tool("baton_handoff_inbox", accepted))["handoffs"] == []
            tool_error(await a.call_tool("baton_handoff_inbox", {"party": "*"}), "FORBIDDEN")
            no_party = tool_error(
                await a.call_tool("baton_handoff_inbox", {"status": "pending"}),
                "VALIDATION_ERROR",
            )
            # the message the CLI and REST give for the same request (tests/cli, tests/rest)
            assert no_party["message"] == STATUS_NEEDS_PARTY

    run(main)


def test_event_list_filters_and_paging(open_session: Open) -> None:
    """baton_event_list takes the filters of events.list: resource_type with resource_id
    (the events of that resource's leases), subject; only one of the resource pair, or a
    bad id, is VALIDATION_ERROR. ``after`` given at all (0 too) with ``cursor`` is
    VALIDATION_ERROR, and a bad ``after`` names ``after``. A page exactly ``limit`` long at
    the end has no next_cursor."""

    async def main() -> None:
        async with open_session("agent-a") as a:
            for rid in ("web", "db"):
                lease = {"resource_type": "deploy", "resource_id": rid, "ttl_seconds": 60}
                ok(await a.call_tool("baton_lease_acquire", lease))
            save = {"subject_id": "web", "kind": "progress", "state": {"n": 1}}
            ok(await a.call_tool("baton_checkpoint_save", save))
            web = {"resource_type": "deploy", "resource_id": "web"}
            mine = ok(await a.call_tool("baton_event_list", web))
            assert [(e["kind"], e["subject"]) for e in mine["events"]] == [
                ("lease.acquired", "deploy/web")
            ]
            assert mine["next_cursor"] is None
            by_subject = ok(await a.call_tool("baton_event_list", {"subject": "web"}))
            assert [e["kind"] for e in by_subject["events"]] == ["checkpoint.saved"]
            both = ok(await a.call_tool("baton_event_list", {**web, "subject": "web"}))
            assert both["events"] == []
            for bad in (
                {"resource_type": "deploy"},
                {"resource_id": "web"},
                {"resource_type": "deploy", "resource_id": ""},
                {"subject": "s" * 257},
            ):
                tool_error(await a.call_tool("baton_event_list", bad), "VALIDATION_ERROR")

            whole = ok(await a.call_tool("baton_event_list", {"limit": 3}))
            assert len(whole["events"]) == 3
            assert whole["next_cursor"] is None
            first = ok(await a.call_tool("baton_event_list", {"limit": 2}))
            assert first["next_cursor"] is not None
            last = ok(
                await a.call_tool("baton_event_list", {"limit": 2, "cursor": first["next_cursor"]})
            )
            assert [e["kind"] for e in last["events"]] == ["checkpoint.saved"]
            assert last["next_cursor"] is None
            for after in (0, 1):
                clash = {"after": after, "cursor": first["next_cursor"]}
                err = tool_error(await a.call_tool("baton_event_list", clash), "VALIDATION_ERROR")
                assert err["message"] == "give after or cursor, not both"
            negative = tool_error(
                await a.call_tool("baton_event_list", {"after": -1}), "VALIDATION_ERROR"
            )
            assert "after" in negative["message"]
            assert "after_seq" not in negative["message"]
            assert len(ok(await a.call_tool("baton_event_list", {}))["events"]) == 3

    run(main)


def test_checkpoint_history_pages(open_session: Open) -> None:
    """baton_checkpoint_history serves one page of ``limit`` versions, oldest first, with a
    ``next_cursor`` (null on the last page) to pass as ``cursor``; a limit above 100 or a
    foreign cursor is VALIDATION_ERROR."""

    async def main() -> None:
        async with open_session("agent-a") as a:
            where = {"subject_id": "doc", "kind": "progress"}
            for n in range(3):
                ok(await a.call_tool("baton_checkpoint_save", {**where, "state": {"n": n}}))
            versions: list[int] = []
            cursors: list[str | None] = []
            while not cursors or cursors[-1] is not None:
                args: dict[str, Any] = {**where, "limit": 2}
                if cursors:
                    args["cursor"] = cursors[-1]
                page = ok(await a.call_tool("baton_checkpoint_history", args))
                versions += [c["version"] for c in page["checkpoints"]]
                cursors.append(page["next_cursor"])
            assert versions == [1, 2, 3]
            assert len(cursors) == 2
            for bad in ({"limit": 101}, {"cursor": "c1.nonsense"}):
                err = await a.call_tool("baton_checkpoint_history", {**where, **bad})
                tool_error(err, "VALIDATION_ERROR")

    run(main)
