"""Only BatonErrors leave prefect-baton (issue #13 section 2): a raw driver error (or any
other exception) raised below a surface leaves the client, ``baton``, the REST API and the
MCP server as ``UNAVAILABLE`` (database, Redis, connection) or ``INTERNAL_ERROR``, through
the one rule :func:`prefect_baton.errors.as_baton_error`."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import pytest
import sqlalchemy.exc
from fastapi.testclient import TestClient
from mcp import Client

import redis
from prefect_baton import AsyncBaton, Baton, InternalError, UnavailableError, ValidationError
from prefect_baton._client.leases import LeaseAPI
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton.errors import as_baton_error
from prefect_baton.mcp._server import build_server
from prefect_baton.rest import create_app
from prefect_baton.rest.keys import create_key
from tests.cli.conftest import Cli

DRIVER_ERRORS = [
    sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed")),
    sqlalchemy.exc.OperationalError("SELECT", {}, Exception("database is locked")),
    redis.exceptions.ConnectionError("Connection refused"),
]
IDS = ["integrity", "operational", "redis"]


def _raise(exc: BaseException) -> Any:
    def fake(*_a: Any, **_k: Any) -> Any:
        raise exc

    return fake


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite ledger file, empty (created: the CLI's reads refuse a missing file)."""
    path = tmp_path / "ledger.db"
    path.touch()
    return f"sqlite:///{path}"


def test_the_rule() -> None:
    """Driver and connection errors are UNAVAILABLE, anything else INTERNAL_ERROR; the
    network surfaces' messages name nothing internal."""
    for exc in [*DRIVER_ERRORS, ConnectionResetError("reset"), TimeoutError("slow")]:
        assert isinstance(as_baton_error(exc), UnavailableError), exc
    err = as_baton_error(KeyError("x"))
    assert isinstance(err, InternalError)
    assert err.to_dict()["code"] == "INTERNAL_ERROR"
    assert "KeyError" in err.message
    assert as_baton_error(KeyError("x"), expose=False).message == "internal error"
    assert "locked" not in as_baton_error(DRIVER_ERRORS[1], expose=False).message


def test_a_call_that_does_not_bind_is_validation_error(url: str) -> None:
    """A wrong call of a public client method (unknown keyword, missing or surplus
    argument) is the caller's mistake: VALIDATION_ERROR naming the method and the problem,
    sync and async, not INTERNAL_ERROR; a TypeError inside a method stays INTERNAL_ERROR."""
    org = f"org-{uuid.uuid4().hex[:8]}"
    with Baton(ledger_url=url, org=org, principal="a") as b:
        with pytest.raises(ValidationError, match=r"leases\.acquire\(\).*'bogus'"):
            b.leases.acquire("t", "uk", ttl_seconds=60, bogus=1)  # type: ignore[call-arg]
        with pytest.raises(ValidationError, match=r"leases\.transfer\(\)"):
            b.leases.transfer("t", "uk", "bob", "x", "y")  # type: ignore[call-arg]
        with pytest.raises(ValidationError, match=r"checkpoints\.save\(\).*missing"):
            b.checkpoints.save("s")  # type: ignore[call-arg]
        assert not b.leases.inspect("t", "uk").held
        with (
            mock.patch.object(LedgerStore, "list_leases", _raise(TypeError("bug"))),
            pytest.raises(InternalError),
        ):
            b.leases.list()

    async def main() -> None:
        async with AsyncBaton(url, org, "a") as ab:
            with pytest.raises(ValidationError, match="bogus"):
                await ab.events.list(bogus=1)  # type: ignore[call-arg]

    anyio.run(main)


@pytest.mark.parametrize("exc", DRIVER_ERRORS, ids=IDS)
def test_library_sync_and_async(url: str, exc: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver error of the store leaves Baton and AsyncBaton as UNAVAILABLE, chained to
    the original; another exception as INTERNAL_ERROR."""
    org = f"org-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(LedgerStore, "events_list", _raise(exc))
    with Baton(ledger_url=url, org=org, principal="a") as b:
        with pytest.raises(UnavailableError) as info:
            b.events.list()
        assert info.value.__cause__ is exc
        monkeypatch.setattr(LedgerStore, "list_leases", _raise(ValueError("bug")))
        with pytest.raises(InternalError):
            b.leases.list()

    async def main() -> None:
        async with AsyncBaton(url, org, "a") as ab:
            with pytest.raises(UnavailableError):
                await ab.events.list()

    anyio.run(main)


@pytest.mark.parametrize("exc", DRIVER_ERRORS, ids=IDS)
def test_cli(url: str, exc: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    """``baton`` reports a driver error as UNAVAILABLE (exit 11), not INTERNAL_ERROR."""
    monkeypatch.setattr(LeaseAPI, "list", _raise(exc))
    run = Cli(url, f"org-{uuid.uuid4().hex[:8]}")("lease", "list")
    assert run.json["error"]["code"] == "UNAVAILABLE"
    assert run.code == 11


@pytest.mark.parametrize("exc", DRIVER_ERRORS, ids=IDS)
def test_rest(url: str, exc: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    """The REST API answers a driver error with 503 UNAVAILABLE, anything else with 500
    INTERNAL_ERROR, and names nothing internal."""
    org = f"org-{uuid.uuid4().hex[:8]}"
    with TestClient(create_app(url), raise_server_exceptions=False) as client:
        secret, _key = create_key(url, org=org, principal="agent-a")
        h = {"Authorization": f"Bearer {secret}"}
        monkeypatch.setattr(LeaseAPI, "list", _raise(exc))
        r = client.get("/v1/leases", headers=h)
        assert (r.status_code, r.json()["error"]["code"]) == (503, "UNAVAILABLE")
        assert "constraint" not in r.text
        assert "locked" not in r.text
        monkeypatch.setattr(LeaseAPI, "list", _raise(ValueError("secret detail")))
        r = client.get("/v1/leases", headers=h)
        assert (r.status_code, r.json()["error"]["code"]) == (500, "INTERNAL_ERROR")
        assert "secret detail" not in r.text
        # below the client's own boundary: the same, nothing internal in the message
        monkeypatch.undo()
        monkeypatch.setattr(LedgerStore, "list_leases", _raise(exc))
        r = client.get("/v1/leases", headers=h)
        assert (r.status_code, r.json()["error"]["code"]) == (503, "UNAVAILABLE")
        assert type(exc).__name__ not in r.text
        monkeypatch.setattr(LedgerStore, "list_leases", _raise(ValueError("secret detail")))
        r = client.get("/v1/leases", headers=h)
        assert (r.status_code, r.json()["error"]["code"]) == (500, "INTERNAL_ERROR")
        assert "secret detail" not in r.text


@pytest.mark.parametrize("exc", DRIVER_ERRORS, ids=IDS)
def test_mcp(url: str, exc: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    """An MCP tool call hitting a driver error is a tool error with UNAVAILABLE."""
    b = Baton(ledger_url=url, org=f"org-{uuid.uuid4().hex[:8]}", principal="a")
    server = build_server(lambda _ctx: (b, None))
    monkeypatch.setattr(LeaseAPI, "inspect", _raise(exc))

    async def main() -> dict[str, Any]:
        async with Client(server) as client:
            result = await client.call_tool(
                "baton_lease_inspect", {"resource_type": "deploy", "resource_id": "svc"}
            )
            assert result.is_error
            return dict(json.loads(result.content[0].text))  # type: ignore[union-attr]

    try:
        body = anyio.run(main)
    finally:
        b.close()
    assert body["error"]["code"] == "UNAVAILABLE", body
