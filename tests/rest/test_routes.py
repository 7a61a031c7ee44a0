"""Success paths of every REST route, through FastAPI's TestClient."""

from __future__ import annotations

import base64
import json

import pytest
from fastapi.testclient import TestClient

from prefect_baton import ValidationError
from prefect_baton._rules.handoffs import STATUS_NEEDS_PARTY

from .conftest import MakeKey, data, error

LEASE = {"resource_type": "deploy", "resource_id": "checkout", "ttl_seconds": 60}


def test_acquire_inspect_list_release(client: TestClient, make_key: MakeKey) -> None:
    """Acquire is 201 with the lease; inspect and list show it; DELETE releases it once."""
    h = make_key("agent-a")
    r = client.post("/v1/leases", json={**LEASE, "purpose": "smoke"}, headers=h)
    assert r.status_code == 201
    lease = data(r)
    assert lease["lease_id"].startswith("lease_")
    assert lease["owner"] == "agent-a"
    info = data(
        client.get(
            "/v1/leases/inspect",
            params={"resource_type": "deploy", "resource_id": "checkout"},
            headers=h,
        )
    )
    assert info["held"] is True
    assert info["lease"]["lease_id"] == lease["lease_id"]
    listed = data(client.get("/v1/leases", headers=h))["leases"]
    assert [x["lease_id"] for x in listed] == [lease["lease_id"]]
    r = client.delete(f"/v1/leases/{lease['lease_id']}", headers=h)
    assert r.status_code == 200
    out = data(r)
    assert out["lease_id"] == lease["lease_id"]
    assert out["released_at"] is not None
    assert client.delete(f"/v1/leases/{lease['lease_id']}", headers=h).status_code == 404


def test_acquire_replays_with_idempotency_key(client: TestClient, make_key: MakeKey) -> None:
    """The same Idempotency-Key and body replay the lease with meta.replayed true."""
    h = {**make_key("agent-a"), "Idempotency-Key": "run-1"}
    first = client.post("/v1/leases", json=LEASE, headers=h)
    again = client.post("/v1/leases", json=LEASE, headers=h)
    assert first.status_code == again.status_code == 201
    assert first.json()["meta"]["replayed"] is False
    assert again.json()["meta"]["replayed"] is True
    assert data(again)["lease_id"] == data(first)["lease_id"]


def test_renew_transfer_force_release(client: TestClient, make_key: MakeKey) -> None:
    """Renew keeps the id, transfer gives the receiver a new lease, an owner force-releases."""
    h = make_key("agent-a")
    lease = data(client.post("/v1/leases", json=LEASE, headers=h))
    renewed = data(
        client.post(f"/v1/leases/{lease['lease_id']}/renew", json={"ttl_seconds": 120}, headers=h)
    )
    assert renewed["lease_id"] == lease["lease_id"]
    assert renewed["ttl_seconds"] == 120
    assert renewed["version"] == lease["version"] + 1
    body = {"to_principal": "agent-b", "new_execution_key": "exec-b", "ttl_seconds": 60}
    moved = data(client.post(f"/v1/leases/{lease['lease_id']}/transfer", json=body, headers=h))
    assert moved["owner"] == "agent-b"
    assert moved["lease_id"] != lease["lease_id"]
    owner = make_key("boss", role="owner")
    r = client.post(f"/v1/leases/{moved['lease_id']}/force-release", headers=owner)
    assert r.status_code == 200
    assert data(r)["status"] == "released"


def test_renew_without_body(client: TestClient, make_key: MakeKey) -> None:
    """Renew with no body uses the lease's own TTL."""
    h = make_key("agent-a")
    lease = data(client.post("/v1/leases", json=LEASE, headers=h))
    r = client.post(f"/v1/leases/{lease['lease_id']}/renew", headers=h)
    assert r.status_code == 200
    assert data(r)["ttl_seconds"] == 60


def test_handoff_create_inbox_show_resolve(client: TestClient, make_key: MakeKey) -> None:
    """A handoff is in the recipient's inbox only, visible to both, resolved by the recipient."""
    a, b = make_key("agent-a"), make_key("agent-b")
    body = {"to_principal": "agent-b", "subject_id": "ticket-1", "message": "please review"}
    r = client.post("/v1/handoffs", json=body, headers=a)
    assert r.status_code == 201
    hid = data(r)["handoff_id"]
    assert data(r)["status"] == "pending"
    assert data(client.get("/v1/handoffs", headers=a))["handoffs"] == []
    inbox = data(client.get("/v1/handoffs", headers=b))["handoffs"]
    assert [h["handoff_id"] for h in inbox] == [hid]
    assert data(client.get(f"/v1/handoffs/{hid}", headers=a))["to_principal"] == "agent-b"
    r = client.post(f"/v1/handoffs/{hid}/resolve", json={"status": "accepted"}, headers=b)
    assert r.status_code == 200
    assert data(r)["status"] == "accepted"


def test_handoffs_by_party(client: TestClient, make_key: MakeKey) -> None:
    """``GET /v1/handoffs?party=*`` lists everyone's pending handoffs of the org to an owner
    (with ``next_cursor``), is 403 FORBIDDEN to an agent and to a key without
    ``handoffs:read``; ``party=<own name>`` lists what one sent or received; ``status``
    filters it and is 400 without ``party``."""
    a, c = make_key("agent-a"), make_key("agent-c")
    first = data(
        client.post("/v1/handoffs", json={"to_principal": "agent-b", "subject_id": "s"}, headers=a)
    )
    second = data(
        client.post("/v1/handoffs", json={"to_principal": "agent-d", "subject_id": "s"}, headers=c)
    )
    owner = make_key("boss", role="owner")
    page = data(client.get("/v1/handoffs", params={"party": "*", "limit": 1}, headers=owner))
    assert [h["handoff_id"] for h in page["handoffs"]] == [first["handoff_id"]]
    rest = client.get(
        "/v1/handoffs", params={"party": "*", "cursor": page["next_cursor"]}, headers=owner
    )
    assert [h["handoff_id"] for h in data(rest)["handoffs"]] == [second["handoff_id"]]
    error(client.get("/v1/handoffs", params={"party": "*"}, headers=a), 403, "FORBIDDEN")
    error(client.get("/v1/handoffs", params={"party": "agent-c"}, headers=a), 403, "FORBIDDEN")
    no_scope = make_key("boss-2", role="owner", scopes=["leases:read"])
    error(client.get("/v1/handoffs", params={"party": "*"}, headers=no_scope), 403, "FORBIDDEN")
    mine = data(client.get("/v1/handoffs", params={"party": "agent-a"}, headers=a))["handoffs"]
    assert [h["handoff_id"] for h in mine] == [first["handoff_id"]]
    any_ = client.get("/v1/handoffs", params={"party": "*", "status": "accepted"}, headers=owner)
    assert data(any_)["handoffs"] == []
    no_party = client.get("/v1/handoffs", params={"status": "pending"}, headers=a)
    # the message the CLI and MCP give for the same request (tests/cli, tests/mcp)
    assert error(no_party, 400, "VALIDATION_ERROR")["message"] == STATUS_NEEDS_PARTY
    bad = client.get("/v1/handoffs", params={"party": "*", "status": "done"}, headers=owner)
    error(bad, 400, "VALIDATION_ERROR")
    error(
        client.get("/v1/handoffs", params={"party": "*", "limit": 0}, headers=owner),
        400,
        "VALIDATION_ERROR",
    )


def test_handoffs_by_party_refuses_forged_cursors_and_an_agent_named_star(
    client: TestClient, make_key: MakeKey
) -> None:
    """A forged cursor naming an id no database can hold (a lone surrogate; NUL) is 400
    VALIDATION_ERROR on the handoff and lease lists, never 500; no key can be made for a
    principal named ``*`` (it means everyone's in ``party=*`` and ``owner=*``)."""
    a = make_key("agent-a")
    client.post("/v1/handoffs", json={"to_principal": "agent-b", "subject_id": "s"}, headers=a)
    owner = make_key("boss", role="owner")
    with pytest.raises(ValidationError, match="every principal"):
        make_key("*")
    for name, path, who in (
        ("handoffs", "/v1/handoffs", "party"),
        ("leases", "/v1/leases", "owner"),
    ):
        for bad in ("\ud800", "x\x00"):
            cursor = "c1." + base64.urlsafe_b64encode(
                json.dumps([name, 1, bad]).encode()
            ).decode().rstrip("=")
            r = client.get(path, params={who: "*", "cursor": cursor}, headers=owner)
            error(r, 400, "VALIDATION_ERROR")


def test_handoff_carrying_a_lease(client: TestClient, make_key: MakeKey) -> None:
    """Accepting a handoff with lease_id moves the lease to the recipient."""
    a, b = make_key("agent-a"), make_key("agent-b")
    lease = data(client.post("/v1/leases", json=LEASE, headers=a))
    body = {"to_principal": "agent-b", "subject_id": "s", "lease_id": lease["lease_id"]}
    hid = data(client.post("/v1/handoffs", json=body, headers=a))["handoff_id"]
    out = data(client.post(f"/v1/handoffs/{hid}/resolve", json={"status": "accepted"}, headers=b))
    assert out["lease"]["owner"] == "agent-b"


def test_checkpoint_save_get_by_id_history(client: TestClient, make_key: MakeKey) -> None:
    """PUT saves versions; GET by subject/kind, by id and history work; another agent
    reads it by id only once a handoff carries it to them (else 404)."""
    a, b = make_key("agent-a"), make_key("agent-b")
    body = {"subject_id": "ticket-1", "kind": "progress", "state": {"step": 1}}
    first = data(client.put("/v1/checkpoints", json=body, headers=a))
    second = data(client.put("/v1/checkpoints", json={**body, "state": {"step": 2}}, headers=a))
    assert (first["version"], second["version"]) == (1, 2)
    params = {"subject_id": "ticket-1", "kind": "progress"}
    got = data(client.get("/v1/checkpoints", params=params, headers=a))
    assert got["state"] == {"step": 2}
    by_id_path = f"/v1/checkpoints/{got['checkpoint_id']}"
    error(client.get(by_id_path, headers=b), 404, "NOT_FOUND")
    offer = {"to_principal": "agent-b", "subject_id": "ticket-1"}
    offer["checkpoint_id"] = got["checkpoint_id"]
    assert client.post("/v1/handoffs", json=offer, headers=a).status_code == 201
    by_id = data(client.get(by_id_path, headers=b))
    assert by_id["state"] == {"step": 2}
    hist = data(client.get("/v1/checkpoints/history", params=params, headers=a))["checkpoints"]
    assert [c["version"] for c in hist] == [1, 2]


def test_checkpoint_history_pages(client: TestClient, make_key: MakeKey) -> None:
    """``GET /v1/checkpoints/history`` serves one page of ``limit`` versions, oldest first,
    with ``next_cursor`` (``null`` on the last page) to pass as ``cursor``; a limit outside
    1..100 or a foreign cursor is 400 VALIDATION_ERROR."""
    a = make_key("agent-a")
    params = {"subject_id": "ticket-1", "kind": "progress"}
    for step in range(5):
        body = {**params, "state": {"step": step}}
        assert client.put("/v1/checkpoints", json=body, headers=a).status_code == 200
    versions: list[int] = []
    cursors: list[str | None] = []
    cursor = None
    while not cursors or cursor is not None:
        q = {**params, "limit": 2} if cursor is None else {**params, "limit": 2, "cursor": cursor}
        page = data(client.get("/v1/checkpoints/history", params=q, headers=a))
        versions += [c["version"] for c in page["checkpoints"]]
        cursor = page["next_cursor"]
        cursors.append(cursor)
    assert versions == [1, 2, 3, 4, 5]
    assert len(cursors) == 3
    assert cursors[-1] is None
    for bad in ({"limit": 0}, {"limit": 101}, {"cursor": "c1.garbage"}):
        r = client.get("/v1/checkpoints/history", params={**params, **bad}, headers=a)
        error(r, 400, "VALIDATION_ERROR")


def test_checkpoint_fenced_by_lease(client: TestClient, make_key: MakeKey) -> None:
    """A save fenced by a held lease succeeds."""
    h = make_key("agent-a")
    lease = data(client.post("/v1/leases", json=LEASE, headers=h))
    body = {"subject_id": "s", "kind": "k", "state": {}, "fence_lease_id": lease["lease_id"]}
    assert client.put("/v1/checkpoints", json=body, headers=h).status_code == 200


def test_outcomes_record_and_list(client: TestClient, make_key: MakeKey) -> None:
    """An outcome is recorded (201) and listed by subject."""
    h = make_key("agent-a")
    body = {
        "subject_id": "ticket-1",
        "status": "succeeded",
        "evidence": [{"kind": "ci", "uri": "https://ci/1"}],
    }
    r = client.post("/v1/outcomes", json=body, headers=h)
    assert r.status_code == 201
    assert data(r)["status"] == "succeeded"
    listed = data(client.get("/v1/outcomes", params={"subject_id": "ticket-1"}, headers=h))
    assert [o["outcome_id"] for o in listed["outcomes"]] == [data(r)["outcome_id"]]
    assert listed["next_cursor"] is None


def test_outcomes_page_by_cursor(client: TestClient, make_key: MakeKey) -> None:
    """``GET /v1/outcomes`` answers one page with ``next_cursor``; following it gives every
    outcome once, oldest first (the unpaged order); a malformed cursor, one of another list
    and one naming an id no database can hold are 400 VALIDATION_ERROR."""
    h = make_key("agent-a")
    for i in range(5):
        body = {"subject_id": f"ticket-{i % 2}", "status": "failed"}
        assert client.post("/v1/outcomes", json=body, headers=h).status_code == 201
    everything = data(client.get("/v1/outcomes", headers=h))["outcomes"]
    assert len(everything) == 5
    seen: list[str] = []
    params: dict[str, object] = {"limit": 2}
    for _ in range(5):
        page = data(client.get("/v1/outcomes", params=params, headers=h))
        assert set(page) == {"outcomes", "next_cursor"}
        seen += [o["outcome_id"] for o in page["outcomes"]]
        if page["next_cursor"] is None:
            break
        params = {"limit": 2, "cursor": page["next_cursor"]}
    assert seen == [o["outcome_id"] for o in everything]
    leases_cursor = "c1." + base64.urlsafe_b64encode(b'["leases",1,"lease_x"]').decode()
    forged = "c1." + base64.urlsafe_b64encode(
        json.dumps(["outcomes", 1, "x\x00"]).encode()
    ).decode().rstrip("=")
    for bad in ("nonsense", "c1.!!!", leases_cursor, forged):
        r = client.get("/v1/outcomes", params={"cursor": bad}, headers=h)
        error(r, 400, "VALIDATION_ERROR")


def test_events_after_limit_kind(client: TestClient, make_key: MakeKey) -> None:
    """Events come in order; after, limit and kind filter them."""
    h = make_key("agent-a")
    client.post("/v1/leases", json=LEASE, headers=h)
    client.post("/v1/handoffs", json={"to_principal": "agent-b", "subject_id": "s"}, headers=h)
    events = data(client.get("/v1/events", headers=h))["events"]
    kinds = [e["kind"] for e in events]
    assert "lease.acquired" in kinds
    assert "handoff.created" in kinds
    first = events[0]["seq"]
    later = data(client.get("/v1/events", params={"after": first}, headers=h))["events"]
    assert all(e["seq"] > first for e in later)
    assert len(later) == len(events) - 1
    one = data(client.get("/v1/events", params={"limit": 1}, headers=h))["events"]
    assert len(one) == 1
    only = data(client.get("/v1/events", params={"kind": "handoff.created"}, headers=h))
    assert {e["kind"] for e in only["events"]} == {"handoff.created"}


def test_events_by_resource_and_subject(client: TestClient, make_key: MakeKey) -> None:
    """``resource_type`` with ``resource_id`` keeps the events of that resource's leases,
    ``subject`` those of that subject; both page with ``next_cursor`` (the filters given
    again) and are documented query parameters."""
    h = make_key("agent-a")
    client.post("/v1/leases", json=LEASE, headers=h)
    client.post("/v1/leases", json={**LEASE, "resource_id": "other"}, headers=h)
    client.post("/v1/handoffs", json={"to_principal": "agent-b", "subject_id": "s"}, headers=h)
    mine = {"resource_type": "deploy", "resource_id": "checkout"}
    got = data(client.get("/v1/events", params=mine, headers=h))
    assert [(e["kind"], e["subject"]) for e in got["events"]] == [
        ("lease.acquired", "deploy/checkout")
    ]
    assert got["next_cursor"] is None
    by_subject = data(client.get("/v1/events", params={"subject": "s"}, headers=h))["events"]
    assert [e["kind"] for e in by_subject] == ["handoff.created"]
    client.post(f"/v1/leases/{got['events'][0]['payload']['lease_id']}/renew", headers=h)
    renewed = {"subject": "deploy/checkout"}
    first = data(client.get("/v1/events", params={"limit": 1, **renewed}, headers=h))
    assert [e["kind"] for e in first["events"]] == ["lease.acquired"]
    assert first["next_cursor"] is not None
    rest = {"cursor": first["next_cursor"], **renewed}
    last = data(client.get("/v1/events", params=rest, headers=h))
    assert [e["kind"] for e in last["events"]] == ["lease.renewed"]
    assert last["next_cursor"] is None
    documented = client.get("/openapi.json").json()["paths"]["/v1/events"]["get"]["parameters"]
    assert {"resource_type", "resource_id", "subject"} <= {p["name"] for p in documented}


@pytest.mark.parametrize(
    "params",
    [
        {"resource_type": "deploy"},
        {"resource_id": "checkout"},
        {"resource_type": "", "resource_id": "checkout"},
        {"resource_type": "deploy", "resource_id": ""},
        {"resource_type": "deploy", "resource_id": "a\x00b"},
        {"resource_type": "d" * 257, "resource_id": "checkout"},
        {"subject": ""},
        {"subject": "s\x1f"},
        {"subject": "s" * 257},
    ],
    ids=[
        "type-alone",
        "id-alone",
        "type-empty",
        "id-empty",
        "id-control",
        "type-too-long",
        "subject-empty",
        "subject-control",
        "subject-too-long",
    ],
)
def test_bad_event_filter_is_400(
    client: TestClient, make_key: MakeKey, params: dict[str, str]
) -> None:
    """Only one of resource_type/resource_id, or a bad id, is ``400 VALIDATION_ERROR``."""
    error(client.get("/v1/events", params=params, headers=make_key()), 400, "VALIDATION_ERROR")


def test_events_after_is_named_after(client: TestClient, make_key: MakeKey) -> None:
    """A bad ``after`` is ``400 VALIDATION_ERROR`` whose message names ``after`` (the query
    parameter), not the Python keyword."""
    h = make_key()
    for after in (-1, 2**63):
        body = error(
            client.get("/v1/events", params={"after": after}, headers=h), 400, "VALIDATION_ERROR"
        )
        assert body["message"] == "after must be an integer from 0 to 2**63 - 1"
        assert "after_seq" not in body["message"]


def test_events_after_with_cursor_is_refused_even_at_zero(
    client: TestClient, make_key: MakeKey
) -> None:
    """``after`` given at all (``after=0`` too) with ``cursor`` is ``400 VALIDATION_ERROR``;
    neither reads from the start, ``after=0`` alone too."""
    h = make_key()
    for rid in "ab":
        client.post("/v1/leases", json={**LEASE, "resource_id": rid}, headers=h)
    cursor = data(client.get("/v1/events", params={"limit": 1}, headers=h))["next_cursor"]
    assert cursor is not None
    for after in (0, 1, 5):
        both = client.get("/v1/events", params={"after": after, "cursor": cursor}, headers=h)
        body = error(both, 400, "VALIDATION_ERROR")
        assert body["message"] == "give after or cursor, not both"
    assert len(data(client.get("/v1/events", headers=h))["events"]) == 2
    assert len(data(client.get("/v1/events", params={"after": 0}, headers=h))["events"]) == 2
    after_cursor = data(client.get("/v1/events", params={"cursor": cursor}, headers=h))
    assert len(after_cursor["events"]) == 1


@pytest.mark.parametrize("path", ["/v1/leases", "/v1/handoffs", "/v1/outcomes", "/v1/events"])
def test_an_exactly_full_last_page_has_no_next_cursor(
    client: TestClient, make_key: MakeKey, path: str
) -> None:
    """A list of exactly ``limit`` items is one page without ``next_cursor``; one item more
    makes a first page of ``limit`` with a cursor and a second page of the one item left,
    without one."""
    sender, h = make_key("agent-a"), make_key("agent-b")
    key = path.rsplit("/", 1)[1]

    def add(i: int) -> None:
        if key == "handoffs":
            offer = {"to_principal": "agent-b", "subject_id": f"s{i}"}
            client.post("/v1/handoffs", json=offer, headers=sender)
        elif key == "outcomes":
            client.post("/v1/outcomes", json={"subject_id": f"s{i}", "status": "failed"}, headers=h)
        else:
            client.post("/v1/leases", json={**LEASE, "resource_id": f"r{i}"}, headers=h)

    for i in range(3):
        add(i)
    whole = data(client.get(path, params={"limit": 3}, headers=h))
    assert len(whole[key]) == 3
    assert whole["next_cursor"] is None
    add(3)
    first = data(client.get(path, params={"limit": 3}, headers=h))
    assert len(first[key]) == 3
    assert first["next_cursor"] is not None
    second = data(client.get(path, params={"limit": 3, "cursor": first["next_cursor"]}, headers=h))
    assert len(second[key]) == 1
    assert second[key][0] not in first[key]
    assert second["next_cursor"] is None


def test_openapi_is_served(client: TestClient) -> None:
    """The OpenAPI document is served without a key and lists the /v1 routes."""
    doc = client.get("/openapi.json").json()
    assert "/v1/leases" in doc["paths"]
    assert "/v1/events" in doc["paths"]


def test_openapi_declares_errors_not_422(client: TestClient) -> None:
    """Every /v1 operation documents the error envelope statuses, none documents 422."""
    doc = client.get("/openapi.json").json()
    for path, item in doc["paths"].items():
        for op in item.values():
            assert "422" not in op["responses"], path
            assert {"400", "401", "403", "404", "409", "413", "503"} <= set(op["responses"])
            assert op["security"] == [{"bearer": []}]
