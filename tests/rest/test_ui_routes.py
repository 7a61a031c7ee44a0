"""The live page's routes: ``/ui`` and its assets are served from the package with a
strict Content-Security-Policy, need no key, carry no data, and stay out of the OpenAPI
document; ``GET /v1/reconciler/lag`` answers for the key's org."""

from __future__ import annotations

import re

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
    assert not [p for p in paths if p.startswith("/ui")]
    assert "/v1/reconciler/lag" in paths


def test_lag_on_the_ledger_authority(client: TestClient, make_key: MakeKey) -> None:
    got = data(client.get("/v1/reconciler/lag", headers=make_key(scopes=["events:read"])))
    assert got == {"authority": "ledger", "entries": 0, "seconds": 0.0}


def test_lag_needs_a_key(client: TestClient) -> None:
    error(client.get("/v1/reconciler/lag"), 401, "UNAUTHENTICATED")
