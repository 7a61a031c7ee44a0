"""``GET /metrics`` of the REST app: authenticated with the bearer keys of ``/v1``, showing
only the caller's organization (counters and gauges), and absent from the OpenAPI
document."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from .conftest import MakeKey

LEASE = {"resource_type": "deploy", "ttl_seconds": 60}


def test_metrics_needs_a_key(client: TestClient) -> None:
    """No key, or an unknown one, is ``401 UNAUTHENTICATED``, as on ``/v1``."""
    r = client.get("/metrics")
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "UNAUTHENTICATED"
    r = client.get("/metrics", headers={"Authorization": "Bearer bk_unknown"})
    assert r.status_code == 401


def test_metrics_show_only_the_callers_org(client: TestClient, make_key: MakeKey, org: str) -> None:
    """A key of any role and scope reads its organization's counters and gauges; another
    organization's activity and the resource ids never appear."""
    other = "org-" + uuid.uuid4().hex[:8]
    mine = make_key("agent-a", scopes=["leases:write"])
    theirs = make_key("agent-z", scopes=["leases:write"], org_=other)
    reader = make_key("watcher", scopes=[])  # no scope at all
    rid = "rid-" + uuid.uuid4().hex
    assert (
        client.post("/v1/leases", json={**LEASE, "resource_id": rid}, headers=mine).status_code
        == 201
    )
    held = client.post("/v1/leases", json={**LEASE, "resource_id": rid}, headers=theirs)
    assert held.status_code == 201
    r = client.post("/v1/leases", json={**LEASE, "resource_id": rid}, headers=make_key("agent-b"))
    assert r.status_code == 409

    r = client.get("/metrics", headers=reader)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    granted = (
        f'baton_acquires_total{{organization="{org}",resource_type="deploy",result="granted"}} 1.0'
    )
    conflict = (
        f'baton_acquires_total{{organization="{org}",resource_type="deploy",result="conflict"}} 1.0'
    )
    assert granted in text
    assert conflict in text
    assert f'baton_effective_leases{{organization="{org}",resource_type="deploy"}} 1.0' in text
    assert other not in text
    assert rid not in text
    assert "# TYPE baton_pending_handoffs gauge" in text


def test_metrics_route_is_not_in_the_openapi_document(client: TestClient) -> None:
    """The schema (and so the schemathesis run over it) does not list ``/metrics``."""
    assert "/metrics" not in client.get("/openapi.json").json()["paths"]
