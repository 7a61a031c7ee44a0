"""Fixtures of the MCP server tests: a SQLite ledger under ``tmp_path``, ``baton mcp``
spawned over stdio by the ``mcp`` package's own stdio client, and ``baton mcp --transport
http`` served in a subprocess on a free 127.0.0.1 port (stopped by its pid), reached with
the package's streamable HTTP client. Every test talks to the server through
:class:`mcp.ClientSession`, never by calling the handlers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult
from sqlalchemy import func, select
from sqlmodel import Session

from prefect_baton._stores.ledger import tables
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton.rest.keys import create_key

BATON = str(Path(sys.executable).parent / "baton")

#: Tables a refused call must leave untouched.
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

LEASE = {"resource_type": "deploy", "resource_id": "checkout-service", "ttl_seconds": 600}


@pytest.fixture
def ledger_url(tmp_path: Path) -> str:
    """A fresh SQLite ledger file for one test, migrated before any server opens it."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    LedgerStore(url).close()
    return url


@pytest.fixture
def org() -> str:
    """A fresh organization id."""
    return "org-" + uuid.uuid4().hex[:8]


def row_counts(ledger_url: str) -> dict[str, int]:
    """Rows per write table of the ledger (to show a call wrote nothing)."""
    from prefect_baton._stores.ledger.engine import make_engines

    engines = make_engines(ledger_url)
    try:
        with Session(engines.read) as session:
            return {
                str(model.__tablename__): int(
                    session.execute(select(func.count()).select_from(model)).scalar_one()
                )
                for model in WRITE_TABLES
            }
    finally:
        engines.dispose()


def ok(result: CallToolResult) -> dict[str, Any]:
    """The structured result of a successful call; its text content is the same JSON."""
    assert not result.is_error, result.content
    assert result.structured_content is not None
    text = result.content[0]
    assert text.type == "text"
    assert json.loads(text.text) == result.structured_content
    return result.structured_content


def tool_error(result: CallToolResult, code: str) -> dict[str, Any]:
    """The ``error`` of a tool error, asserting its code; text and structure agree."""
    assert result.is_error, result.structured_content
    text = result.content[0]
    assert text.type == "text"
    body = json.loads(text.text)
    assert body == result.structured_content
    assert set(body) == {"error"}, body
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    return dict(body["error"])


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}


StdioSession = Callable[..., Any]


@pytest.fixture
def stdio_session(ledger_url: str, org: str, tmp_path: Path) -> Callable[..., Any]:
    """``async with stdio_session("agent-a") as session``: ``baton mcp`` spawned over stdio
    for that principal of ``org`` by the ``mcp`` stdio client, initialised."""

    @asynccontextmanager
    async def open_(
        principal: str, *extra: str, role: str = "agent", org_: str | None = None
    ) -> AsyncIterator[ClientSession]:
        params = StdioServerParameters(
            command=BATON,
            args=[
                "--ledger-url",
                ledger_url,
                "--org",
                org_ or org,
                "--principal",
                principal,
                "--role",
                role,
                *extra,
                "mcp",
            ],
            env=_clean_env(),
        )
        with (tmp_path / f"stdio-{principal}.log").open("a") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                yield session

    return open_


@dataclass
class HttpServer:
    """A ``baton mcp --transport http`` process: its endpoint URL and its log file."""

    url: str
    log: Path
    ledger_url: str
    org: str

    def key(self, principal: str, *, role: str = "agent", scopes: list[str] | None = None) -> str:
        """A new bearer key of ``principal`` in this server's org (the secret)."""
        secret, _ = create_key(
            self.ledger_url, org=self.org, principal=principal, role=role, scopes=scopes
        )
        return secret

    @asynccontextmanager
    async def session(self, secret: str | None) -> AsyncIterator[ClientSession]:
        """An initialised client session sending ``Authorization: Bearer <secret>``."""
        headers = {"Authorization": f"Bearer {secret}"} if secret is not None else None
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60, read=300)) as http,
            streamable_http_client(self.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_http(
    ledger_url: str, log: Path, *extra: str, redis_url: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``baton mcp --transport http`` on a free loopback port; returns the process
    and the endpoint URL once the port answers."""
    port = _free_port()
    args = [BATON, "--ledger-url", ledger_url, *extra]
    if redis_url:
        args += ["--redis-url", redis_url]
    args += ["mcp", "--transport", "http", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        env = {**_clean_env(), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"baton mcp exited {proc.returncode}: {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        stop(proc)
        raise AssertionError(f"baton mcp did not listen on {port}: {log.read_text()}")
    return proc, f"http://127.0.0.1:{port}/mcp"


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server by its pid (SIGTERM, then SIGKILL)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture
def http_server(ledger_url: str, org: str, tmp_path: Path) -> Iterator[HttpServer]:
    """``baton mcp --transport http`` over ``ledger_url``, started as a subprocess with
    ``--principal mallory`` (which HTTP must ignore) and stopped by pid after the test."""
    log = tmp_path / "mcp-http.log"
    proc, url = start_http(ledger_url, log, "--org", org, "--principal", "mallory")
    try:
        yield HttpServer(url=url, log=log, ledger_url=ledger_url, org=org)
    finally:
        stop(proc)


def run(main: Callable[[], Any], timeout_s: float = 120) -> Any:
    """Run the coroutine function ``main`` under anyio, failing instead of hanging."""

    async def bounded() -> Any:
        with anyio.fail_after(timeout_s):
            return await main()

    return anyio.run(bounded)


async def race(calls: list[Callable[[], Any]]) -> list[Any]:
    """Start every call, release them together, and return their results in order."""
    out: list[Any] = [None] * len(calls)
    go = anyio.Event()

    async def one(i: int) -> None:
        await go.wait()
        out[i] = await calls[i]()

    async with anyio.create_task_group() as tg:
        for i in range(len(calls)):
            tg.start_soon(one, i)
        await anyio.sleep(0.05)
        go.set()
    return out
