"""Fixtures of the REST API tests: a SQLite ledger under ``tmp_path``, the app behind
FastAPI's TestClient, and a factory of bearer keys (returning request headers)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlmodel import Session

from prefect_baton._stores.ledger import tables
from prefect_baton.rest import create_app, create_key

Headers = dict[str, str]
MakeKey = Callable[..., Headers]

#: Tables a bad request must leave untouched.
WRITE_TABLES = (
    tables.GenerationRow,
    tables.LeaseTransition,
    tables.CheckpointRow,
    tables.CheckpointVersion,
    tables.HandoffRow,
    tables.OutcomeRow,
    tables.ReceiptRow,
    tables.EventRow,
)


@pytest.fixture
def ledger_url(tmp_path: Path) -> str:
    """A fresh SQLite ledger file for one test."""
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def org() -> str:
    """A fresh organization id."""
    return "org-" + uuid.uuid4().hex[:8]


@pytest.fixture
def client(ledger_url: str) -> Iterator[TestClient]:
    """The app over ``ledger_url`` in a TestClient (lifespan run)."""
    with TestClient(create_app(ledger_url), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def make_key(ledger_url: str, org: str) -> MakeKey:
    """Create a key and return its ``Authorization`` header."""

    def make(
        principal: str = "agent-a",
        role: str = "agent",
        scopes: Iterable[str] | None = None,
        org_: str | None = None,
    ) -> Headers:
        secret, _key = create_key(
            ledger_url, org=org_ or org, principal=principal, role=role, scopes=scopes
        )
        return {"Authorization": f"Bearer {secret}"}

    return make


def row_counts(ledger_url: str) -> dict[str, int]:
    """Rows per write table of the ledger (to show a request wrote nothing)."""
    from prefect_baton._stores.ledger.engine import make_engines

    engines = make_engines(ledger_url)
    try:
        with Session(engines.read) as session:
            out: dict[str, int] = {}
            for model in WRITE_TABLES:
                name = str(model.__tablename__)
                q = select(func.count()).select_from(model)
                out[name] = int(session.execute(q).scalar_one())
            return out
    finally:
        engines.dispose()


def data(resp: Any) -> Any:
    """The ``data`` of a success envelope (asserting the envelope's shape)."""
    body = resp.json()
    assert set(body) == {"data", "meta"}, body
    assert body["meta"]["request_id"].startswith("req_")
    return body["data"]


def error(resp: Any, status: int, code: str) -> dict[str, Any]:
    """The ``error`` of an error envelope, asserting its status, its code and its
    ``meta.request_id`` (the ``X-Request-ID`` header's)."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error", "meta"}, body
    assert body["meta"] == {"request_id": resp.headers["x-request-id"]}, body
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str)
    return dict(body["error"])
