"""The body limit follows the checkpoint state cap (``request_body_limit``): ``baton serve``
and ``baton mcp --transport http`` as subprocesses, with the default cap (1 MiB) and with
``BATON_STATE_MAX_BYTES`` at 3 MiB, over the SQLite and PostgreSQL ledgers and the Redis
lease authority. A state within the cap is saved however the client encodes its JSON (ASCII
escapes turn 1 MiB of "é" into a 3 MiB body); a state over the cap is still the cap's
``400 VALIDATION_ERROR``; a body over the limit is still ``413`` and writes nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefect_baton._rules.validation import request_body_limit
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton.rest.keys import create_key
from tests.conftest import PG_URL, REDIS_URL, require_postgresql, require_redis
from tests.mcp.conftest import stop
from tests.unit.test_body_limit import WIDE, state_at

from .conftest import row_counts
from .test_served_limits import INITIALIZE

BATON = str(Path(sys.executable).parent / "baton")
MIB = 1024 * 1024
LEASE = {"resource_type": "deploy", "resource_id": "big-state", "ttl_seconds": 600}
#: (ledger arm, BATON_STATE_MAX_BYTES or None for the default) of each served process.
SERVERS = [(arm, cap) for cap in (None, 3 * MIB) for arm in ("sqlite", "postgresql", "redis")]


@dataclass
class Served:
    """A ``baton serve`` process: base URL, ledger URL, log and a key's headers."""

    base: str
    ledger_url: str
    log: Path
    headers: dict[str, str]

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request with the key (timeout 120 s: bodies of up to 9 MiB)."""
        headers = {**self.headers, **kw.pop("headers", {})}
        return httpx.request(method, self.base + path, headers=headers, timeout=120, **kw)

    def cap(self) -> int:
        """The server's ``state_max_bytes`` as ``GET /v1/me`` reports it."""
        resp = self.call("GET", "/v1/me")
        assert resp.status_code == 200, resp.text
        return int(resp.json()["data"]["state_max_bytes"])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: list[str], cap: int | None, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``baton <args> --port <free port>`` with no ``BATON_*`` variable but
    ``BATON_STATE_MAX_BYTES`` (``cap``, when given); returns it once the port answers."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    if cap is not None:
        env["BATON_STATE_MAX_BYTES"] = str(cap)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [BATON, *args, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise AssertionError(log.read_text())
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, port
        except OSError:
            if time.monotonic() > deadline:
                stop(proc)
                raise AssertionError(log.read_text()) from None
            time.sleep(0.05)


@pytest.fixture(scope="module", params=SERVERS, ids=[f"{a}-{c or 'default'}" for a, c in SERVERS])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """``baton serve`` over the arm's ledger (Redis: the lease authority, SQLite behind
    it) with the arm's cap, and a key of a fresh org."""
    arm, cap = request.param
    tmp_path = tmp_path_factory.mktemp(arm)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    extra: list[str] = []
    if arm == "postgresql":
        require_postgresql()
        url = PG_URL
    elif arm == "redis":
        require_redis()
        extra = ["--redis-url", REDIS_URL]
    LedgerStore(url).close()
    org = f"org-{uuid.uuid4().hex[:12]}"
    key, _ = create_key(url, org=org, principal="alice", role="agent")
    log = tmp_path / "server.log"
    proc, port = start(["--ledger-url", url, *extra, "serve"], cap, log)
    try:
        yield Served(f"http://127.0.0.1:{port}", url, log, {"Authorization": f"Bearer {key}"})
    finally:
        stop(proc)


def _checkpoint(served: Served, body: bytes) -> httpx.Response:
    return served.call(
        "PUT", "/v1/checkpoints", content=body, headers={"Content-Type": "application/json"}
    )


@pytest.mark.parametrize("char", ["\u00e9", WIDE], ids=["2-byte", "4-byte"])
def test_a_state_at_the_cap_sent_escaped_is_saved(served: Served, char: str) -> None:
    """A state of exactly the cap's bytes of 2-byte or 4-byte characters, sent with ASCII
    escapes (``json.dumps``' default: a body 3 times the cap, over 2 MiB) and fenced by a
    lease, is saved (200) and reads back equal."""
    cap = served.cap()
    state = state_at(cap, char)
    lease = served.call("POST", "/v1/leases", json={**LEASE, "resource_id": uuid.uuid4().hex})
    assert lease.status_code == 201, lease.text
    subject = uuid.uuid4().hex
    fields = {
        "subject_id": subject,
        "kind": "k",
        "fence_lease_id": lease.json()["data"]["lease_id"],
    }
    body = json.dumps({**fields, "state": state}).encode()
    assert len(body) > 3 * cap > 2 * MIB
    saved = _checkpoint(served, body)
    assert saved.status_code == 200, saved.text[:300]
    assert saved.json()["data"]["version"] == 1
    got = served.call("GET", "/v1/checkpoints", params={"subject_id": subject, "kind": "k"})
    assert got.status_code == 200, got.text[:300]
    assert got.json()["data"]["state"] == state


def test_a_state_over_the_cap_is_still_400(served: Served) -> None:
    """A state one byte over the cap, sent escaped (within the body limit), is the cap's
    own 400 VALIDATION_ERROR, and writes nothing."""
    cap = served.cap()
    before = row_counts(served.ledger_url)
    body = json.dumps({"subject_id": "s", "kind": "k", "state": state_at(cap + 1, "\u00e9")})
    assert len(body) <= request_body_limit(cap)
    resp = _checkpoint(served, body.encode())
    assert resp.status_code == 400, resp.text[:300]
    err = resp.json()["error"]
    assert err["code"] == "VALIDATION_ERROR"
    assert f"state is {cap + 1} bytes of JSON; at most {cap}" in err["message"]
    assert row_counts(served.ledger_url) == before


def test_a_body_over_the_limit_is_still_413(served: Served) -> None:
    """A body of exactly the limit reaches the route (400: its state is over the cap); one
    byte more is 413 PAYLOAD_TOO_LARGE naming the limit, announced by Content-Length or
    streamed; nothing is written."""
    limit = request_body_limit(served.cap())
    before = row_counts(served.ledger_url)
    head, tail = b'{"subject_id": "s", "kind": "k", "state": {"x": "', b'"}}'
    exact = head + b"a" * (limit - len(head) - len(tail)) + tail
    assert len(exact) == limit
    resp = _checkpoint(served, exact)
    assert resp.status_code == 400, resp.text[:300]
    assert resp.json()["error"]["code"] == "VALIDATION_ERROR"
    over = exact[: -len(tail)] + b"a" + tail

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(over), 1 << 20):
            yield over[i : i + (1 << 20)]

    for content in (over, chunks()):
        resp = served.call(
            "PUT", "/v1/checkpoints", content=content, headers={"Content-Type": "application/json"}
        )
        assert resp.status_code == 413, resp.text[:300]
        err = resp.json()["error"]
        assert err["code"] == "PAYLOAD_TOO_LARGE"
        assert str(limit) in err["message"]
    assert row_counts(served.ledger_url) == before


def test_a_state_over_2_mib(served: Served) -> None:
    """A state of 2 MiB + 1 byte (ASCII, sent compact) is saved by a server whose cap
    allows it (``BATON_STATE_MAX_BYTES`` of 3 MiB) and is 400 over the default cap."""
    cap = served.cap()
    state = state_at(2 * MIB + 1, "a")
    subject = uuid.uuid4().hex
    body = json.dumps({"subject_id": subject, "kind": "k", "state": state}, separators=(",", ":"))
    resp = _checkpoint(served, body.encode())
    if cap < 2 * MIB + 1:
        assert resp.status_code == 400, resp.text[:300]
        assert resp.json()["error"]["code"] == "VALIDATION_ERROR"
        return
    assert resp.status_code == 200, resp.text[:300]
    got = served.call("GET", "/v1/checkpoints", params={"subject_id": subject, "kind": "k"})
    assert got.json()["data"]["state"] == state


# --------------------------------------------------------------------------- MCP over HTTP

MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
}


def _message(resp: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a response (JSON, or the ``data:`` of an SSE event)."""
    assert resp.status_code == 200, resp.text[:300]
    if resp.headers["content-type"].startswith("application/json"):
        return dict(resp.json())
    data = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
    return dict(json.loads(data[-1]))


def _call(rpc_id: int, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The JSON-RPC ``tools/call`` message of ``tool`` with ``arguments``."""
    params = {"name": tool, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params}


@pytest.mark.parametrize("cap", [None, 3 * MIB], ids=["default", "3MiB"])
def test_mcp_saves_a_state_at_the_cap_sent_escaped(
    cap: int | None, tmp_path: Path, org: str
) -> None:
    """``baton mcp --transport http`` takes a ``baton_checkpoint_save`` whose state is at
    the cap of 4-byte characters, ASCII-escaped (a body over 3 times the cap), and reads
    it back equal; a body one byte over the limit is 413 PAYLOAD_TOO_LARGE and writes
    nothing."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    LedgerStore(url).close()
    key, _ = create_key(url, org=org, principal="alice", role="agent")
    proc, port = start(["--ledger-url", url, "mcp", "--transport", "http"], cap, tmp_path / "log")
    endpoint = f"http://127.0.0.1:{port}/mcp"
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {key}"}
    try:
        resp = httpx.post(endpoint, json=INITIALIZE, headers=headers, timeout=30)
        _message(resp)
        assert "mcp-session-id" not in resp.headers  # stateless: each request stands alone
        headers["mcp-protocol-version"] = "2025-06-18"
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert httpx.post(endpoint, json=note, headers=headers, timeout=30).status_code == 202
        me = _message(httpx.post(endpoint, json=_call(2, "baton_whoami", {}), headers=headers))
        state_max = int(me["result"]["structuredContent"]["state_max_bytes"])
        assert state_max == (cap or 1024 * 1024)
        state = state_at(state_max, WIDE)
        args = {"subject_id": "s", "kind": "k", "state": state}
        body = json.dumps(_call(3, "baton_checkpoint_save", args)).encode()
        assert len(body) > 3 * state_max
        resp = httpx.post(endpoint, content=body, headers=headers, timeout=120)
        result = _message(resp)["result"]
        assert not result.get("isError"), str(result)[:300]
        assert result["structuredContent"]["state"] == state
        get = _call(4, "baton_checkpoint_get", {"subject_id": "s", "kind": "k"})
        got = _message(httpx.post(endpoint, json=get, headers=headers, timeout=120))
        assert got["result"]["structuredContent"]["state"] == state
        before = row_counts(url)
        limit = request_body_limit(state_max)
        over = b'{"x": "' + b"a" * (limit + 1 - 9) + b'"}'
        assert len(over) == limit + 1
        resp = httpx.post(endpoint, content=over, headers=headers, timeout=120)
        assert resp.status_code == 413, resp.text[:300]
        assert resp.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
        assert row_counts(url) == before
    finally:
        stop(proc)
