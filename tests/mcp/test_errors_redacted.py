"""A tool error whose detail belongs to the server (a database driver's host, port, role
and database) reaches the MCP client as UNAVAILABLE with a request id only; the server log
keeps the detail. The server runs in-process behind the ``mcp`` package's own client."""

from __future__ import annotations

import pytest
from mcp.client.client import Client

from prefect_baton import errors
from prefect_baton._client.leases import LeaseAPI
from prefect_baton.mcp import build_server
from prefect_baton.testing import memory_baton

from .conftest import LEASE, run, tool_error

DETAIL = (
    'ledger database unavailable: connection to server at "db.internal" (10.1.2.3), '
    'port 6543 failed: FATAL: role "baton_rw" does not exist; database "prod_ledger"'
)


def test_driver_detail_stays_in_the_server_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """UNAVAILABLE from a tool: the client's message names a request id, not the driver's
    detail; the log has both."""

    def down(*_a: object, **_k: object) -> None:
        raise errors.UnavailableError(DETAIL)

    monkeypatch.setattr(LeaseAPI, "acquire", down)
    baton = memory_baton(org="org-redact", principal="alice")
    server = build_server(lambda _ctx: (baton, None))
    found: dict[str, object] = {}

    async def main() -> None:
        async with Client(server) as client:
            found.update(
                tool_error(await client.call_tool("baton_lease_acquire", LEASE), "UNAVAILABLE")
            )

    with caplog.at_level("WARNING", logger="prefect_baton.rest"):
        run(main)
    baton.close()
    message = str(found["message"])
    assert message.startswith("the service is unavailable; retry later (request req_")
    for secret in ("db.internal", "10.1.2.3", "6543", "baton_rw", "prod_ledger"):
        assert secret not in message
    rid = message.rsplit("request ", 1)[1].rstrip(")")
    assert any(rid in r.getMessage() and DETAIL in r.getMessage() for r in caplog.records)
