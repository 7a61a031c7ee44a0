"""The live page's routes: ``/ui`` and its assets are served from the package with a
strict Content-Security-Policy, need no key, carry no data, and stay out of the OpenAPI
document; ``GET /v1/reconciler/lag`` answers for the key's org."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from .conftest import MakeKey, data, error


def test_page_and_assets_are_served_with_a_strict_policy(client: TestClient) -> None:
    page = client.get("/ui")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "default-src 'none'" in csp
    assert "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    # no inline script: every <script> loads a file of this origin
    assert re.findall(r"<script[^>]*>", page.text) == ['<script src="/ui/ui.js" defer>']
    assert 'style="' not in page.text
    assert "<style" not in page.text
    js = client.get("/ui/ui.js")
    assert js.status_code == 200
    assert js.headers["content-type"].startswith("text/javascript")
    assert "Authorization" in js.text
    css = client.get("/ui/ui.css")
    assert css.status_code == 200
    assert css.headers["content-type"].startswith("text/css")
    redirect = client.get("/ui/", follow_redirects=False)
    assert redirect.status_code == 308
    assert redirect.headers["location"] == "/ui"


def test_unknown_asset_is_not_found(client: TestClient) -> None:
    error(client.get("/ui/../pyproject.toml"), 404, "NOT_FOUND")
    error(client.get("/ui/other.js"), 404, "NOT_FOUND")


def test_page_routes_are_not_in_the_openapi_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith(("/ui", "/v1/resources"))]
    assert "/v1/reconciler/lag" in paths


def test_lag_on_the_ledger_authority(client: TestClient, make_key: MakeKey) -> None:
    got = data(client.get("/v1/reconciler/lag", headers=make_key(scopes=["events:read"])))
    assert got == {"authority": "ledger", "entries": 0, "seconds": 0.0}


def test_lag_needs_a_key(client: TestClient) -> None:
    error(client.get("/v1/reconciler/lag"), 401, "UNAUTHENTICATED")


TIMELINE = "/v1/resources/timeline.svg"
LEASE = {"resource_type": "deploy", "resource_id": "svc/a", "ttl_seconds": 60, "purpose": "p"}


def test_timeline_is_an_svg_of_the_keys_org(client: TestClient, make_key: MakeKey) -> None:
    holder = make_key("holder-a")
    assert client.post("/v1/leases", json=LEASE, headers=holder).status_code == 201
    query = {"resource_type": "deploy", "resource_id": "svc/a"}
    got = client.get(TIMELINE, params=query, headers=holder)
    assert got.status_code == 200, got.text
    assert got.headers["content-type"].startswith("image/svg+xml")
    assert "default-src 'none'" in got.headers["content-security-policy"]
    assert "<svg" in got.text
    assert "svc/a" in got.text
    assert "holder-a" in got.text
    # the same resource id seen from another organization: nothing of it
    stranger = make_key("stranger", org_="org-other")
    other = client.get(TIMELINE, params=query, headers=stranger)
    assert other.status_code == 200
    assert "<svg" in other.text
    assert "holder-a" not in other.text


READS = ["events:read", "leases:read", "outcomes:read", "handoffs:read"]


def test_timeline_needs_a_key_with_every_read_scope_it_draws_from(
    client: TestClient, make_key: MakeKey
) -> None:
    """The picture shows events, lease generations, outcomes with their evidence and
    handoffs: a key lacking any of those read scopes is refused (a key refused by
    ``GET /v1/outcomes`` never reads an outcome's evidence through the picture)."""
    query = {"resource_type": "deploy", "resource_id": "svc"}
    error(client.get(TIMELINE, params=query), 401, "UNAUTHENTICATED")
    for missing in READS:
        lacking = make_key(scopes=[s for s in READS if s != missing])
        err = error(client.get(TIMELINE, params=query, headers=lacking), 403, "FORBIDDEN")
        assert missing in err["message"]
    ok = make_key(scopes=READS)
    assert client.get(TIMELINE, params=query, headers=ok).status_code == 200
    error(
        client.get(TIMELINE, params={"resource_type": "deploy"}, headers=ok),
        400,
        "VALIDATION_ERROR",
    )


@pytest.mark.parametrize("query", [{}, {"resource_type": "deploy"}, {"resource_id": ""}])
def test_timeline_checks_the_scopes_before_the_query(
    client: TestClient, make_key: MakeKey, query: dict[str, str]
) -> None:
    """A key without the picture's scopes is refused (403) whatever its query, as every
    other route refuses before it reads its input; a missing id is 400 only for a key
    that may see the picture."""
    lacking = make_key(scopes=["leases:read"])
    error(client.get(TIMELINE, params=query, headers=lacking), 403, "FORBIDDEN")
    if "resource_id" not in query:
        ok = make_key(scopes=READS)
        error(client.get(TIMELINE, params=query, headers=ok), 400, "VALIDATION_ERROR")


def test_ui_slash_is_the_one_trailing_slash_redirected(
    client: TestClient, make_key: MakeKey
) -> None:
    """docs/rest.md and docs/ui.md: ``/ui/`` redirects to ``/ui`` (``308``, for a browser);
    every other path with a trailing slash (the document's paths, ids as ``x``, the metrics,
    the document and its pages) is ``404 NOT_FOUND`` with no redirect."""
    h = make_key()
    paths = {re.sub(r"\{[^}]+\}", "x", p) for p in client.get("/openapi.json").json()["paths"]}
    paths |= {"/metrics", "/openapi.json", "/docs", "/redoc", "/ui/ui.js", "/v1"}
    for path in sorted(paths):
        error(client.get(path + "/", headers=h, follow_redirects=False), 404, "NOT_FOUND")
    assert client.get("/ui/", follow_redirects=False).status_code == 308
