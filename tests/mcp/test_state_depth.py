"""One nesting limit of stored JSON (``MAX_JSON_DEPTH``, 100 levels), decided in
``_rules/validation.py``: the Python client, the REST API and MCP over stdio and HTTP
accept a checkpoint state at the limit and refuse one a level deeper with the same
``VALIDATION_ERROR`` and message."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from prefect_baton import Baton, ValidationError
from prefect_baton._rules.validation import MAX_JSON_DEPTH
from prefect_baton.rest import create_app, create_key

from .conftest import HttpServer, ok, run, tool_error

MESSAGE = f"state is nested more than {MAX_JSON_DEPTH} levels deep"


def nested(levels: int) -> dict[str, Any]:
    """A JSON object nested ``levels`` levels (``levels`` >= 2; the object itself is level
    1), its innermost value an empty array: ``nested(3) == {"a": {"a": []}}``."""
    value: Any = []
    for _ in range(levels - 1):
        value = {"a": value}
    assert isinstance(value, dict)
    return value


def test_the_helper_counts_levels() -> None:
    """``nested(3)`` is the object, one object in it and one array in that."""
    assert nested(3) == {"a": {"a": []}}


def _save(state: dict[str, Any]) -> dict[str, Any]:
    return {"subject_id": "svc", "kind": "k", "state": state}


def test_the_python_client_and_rest_share_the_limit(ledger_url: str, org: str) -> None:
    """At the limit the state is saved; a level deeper is VALIDATION_ERROR with the same
    message from the Python client and the REST API (400)."""
    b = Baton(ledger_url=ledger_url, org=org, principal="a")
    try:
        assert b.checkpoints.save("svc", "k", nested(MAX_JSON_DEPTH)).version == 1
        with pytest.raises(ValidationError) as refused:
            b.checkpoints.save("svc", "k", nested(MAX_JSON_DEPTH + 1))
        assert refused.value.message == MESSAGE
    finally:
        b.close()
    secret, _ = create_key(ledger_url, org=org, principal="a", role="agent")
    headers = {"Authorization": f"Bearer {secret}"}
    with TestClient(create_app(ledger_url), raise_server_exceptions=False) as client:
        ok_resp = client.post(
            "/v1/checkpoints", headers=headers, json=_save(nested(MAX_JSON_DEPTH))
        )
        assert ok_resp.status_code == 200, ok_resp.text
        assert ok_resp.json()["data"]["version"] == 2
        bad = client.post(
            "/v1/checkpoints", headers=headers, json=_save(nested(MAX_JSON_DEPTH + 1))
        )
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"] == {"code": "VALIDATION_ERROR", "message": MESSAGE}


def test_mcp_over_stdio_and_http_share_the_limit(
    stdio_session: Any, http_server: HttpServer
) -> None:
    """MCP over stdio and over HTTP (whose messages wrap the state in three more levels)
    save a state at the limit and refuse one a level deeper with the same tool error."""

    async def check(session: Any) -> None:
        saved = ok(await session.call_tool("baton_checkpoint_save", _save(nested(MAX_JSON_DEPTH))))
        assert saved["kind"] == "k"
        deeper = _save(nested(MAX_JSON_DEPTH + 1))
        err = tool_error(
            await session.call_tool("baton_checkpoint_save", deeper), "VALIDATION_ERROR"
        )
        assert err["message"] == MESSAGE

    async def main() -> None:
        async with stdio_session("a") as session:
            await check(session)
        async with http_server.session(http_server.key("a")) as session:
            await check(session)

    run(main)
