"""The fast path of ``POST /v1/leases`` and ``DELETE /v1/leases/{id}``
(:mod:`prefect_baton.rest._fastpath`) answers exactly as FastAPI's own handler does: a
request the fast path serves (``Content-Type: application/json``) and the same request
handed to FastAPI (``application/json; charset=utf-8``, which the fast path leaves to it)
get the same status, headers and body; dependency overrides still apply; a route whose
parameters it does not read is refused when the app is built."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.responses import Response

from prefect_baton.rest import _fastpath
from prefect_baton.rest._deps import _baton
from tests.rest.conftest import MakeKey

_IDS = re.compile(r"(lease|req|gen|evt)_[A-Za-z0-9]+|\d{4}-\d\d-\d\dT[0-9:.]+Z?|\b\d{10,}\b")


def _shape(resp: Any) -> tuple[int, list[tuple[str, str]], str]:
    """Status, headers (but date and request id) and body with ids and times masked."""
    headers = sorted((k, _IDS.sub("*", v)) for k, v in resp.headers.items() if k not in ("date",))
    return resp.status_code, headers, _IDS.sub("*", resp.text)


def _pair(
    client: TestClient, headers: dict[str, str], other: dict[str, str], content_type: str, rid: str
) -> list[Any]:
    body = b'{"resource_type": "db", "resource_id": "%s", "ttl_seconds": 60}' % rid.encode()
    h = {**headers, "Content-Type": content_type}
    acquired = client.post("/v1/leases", content=body, headers=h)
    conflict = client.post(
        "/v1/leases", content=body, headers={**other, "Content-Type": content_type}
    )
    lease_id = acquired.json()["data"]["lease_id"]
    released = client.delete(f"/v1/leases/{lease_id}", headers=headers)
    again = client.delete(f"/v1/leases/{lease_id}", headers=headers)
    bad = client.post("/v1/leases", content=b'{"resource_type": 1}', headers=h)
    return [acquired, conflict, released, again, bad]


def test_fast_and_fastapi_handlers_answer_alike(client: TestClient, make_key: MakeKey) -> None:
    """Acquire, a conflicting acquire, release, a repeated release (404) and an invalid
    body: the same answers through the fast path and through FastAPI's handler."""
    h, other = make_key(), make_key("agent-b")
    fast = _pair(client, h, other, "application/json", "fast")
    slow = _pair(client, h, other, "application/json; charset=utf-8", "slow")
    assert [r.status_code for r in fast] == [201, 409, 200, 404, 400]
    for f, s in zip(fast, slow, strict=True):
        status, headers, text = _shape(s)
        assert _shape(f) == (status, headers, text.replace("slow", "fast"))


def test_dependency_overrides_still_apply(client: TestClient, make_key: MakeKey) -> None:
    """With a dependency overridden, the fast path leaves the request to FastAPI, which
    uses the override."""

    async def refuse() -> Any:
        from prefect_baton.errors import ForbiddenError

        raise ForbiddenError("overridden")

    app: Any = client.app
    app.dependency_overrides[_baton] = refuse
    try:
        r = client.post(
            "/v1/leases",
            json={"resource_type": "db", "resource_id": "x", "ttl_seconds": 60},
            headers=make_key(),
        )
    finally:
        app.dependency_overrides.clear()
    assert r.status_code == 403, r.text
    assert r.json()["error"]["message"] == "overridden"


def test_a_route_with_query_parameters_is_refused() -> None:
    """``install`` refuses a route whose parameters it would not read (a query parameter
    here), rather than serve it without them."""
    app = FastAPI()

    @app.get("/x")
    def x(q: str | None = None) -> Response:
        return Response(q or "")

    route = next(r for r in app.router.routes if isinstance(r, APIRoute))
    with pytest.raises(TypeError, match="query"):
        _fastpath.install(route)


def test_an_app_whose_fast_path_cannot_be_installed_still_serves(
    ledger_url: str, make_key: MakeKey, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """A FastAPI whose route internals the fast path cannot read (``install`` raising
    ``AttributeError``) keeps FastAPI's own handlers: the app starts, says so in a
    warning, and acquires and releases as before."""
    from prefect_baton.rest import create_app

    def unreadable(route: APIRoute) -> None:
        raise AttributeError("'APIRoute' object has no attribute 'dependant'")

    monkeypatch.setattr(_fastpath, "install", unreadable)
    with caplog.at_level("WARNING", logger="prefect_baton.rest"):
        app = create_app(ledger_url)
    assert sum("no fast path for /v1/leases" in r.getMessage() for r in caplog.records) == 2
    with TestClient(app, raise_server_exceptions=False) as c:
        h = make_key()
        acquired = c.post(
            "/v1/leases",
            json={"resource_type": "db", "resource_id": "slow", "ttl_seconds": 60},
            headers=h,
        )
        assert acquired.status_code == 201, acquired.text
        released = c.delete(f"/v1/leases/{acquired.json()['data']['lease_id']}", headers=h)
        assert released.status_code == 200, released.text
