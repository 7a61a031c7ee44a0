"""A request whose body never finishes arriving runs nothing: ``baton serve`` as a
subprocess, sent a ``POST /v1/leases`` over a raw socket whose body stops short of its
``Content-Length`` (or a chunked body without its final ``0`` chunk), then the socket
closed. Before, the middleware took the part received for the whole body and the lease was
acquired at the moment of the close. The middleware itself is also driven with a
``receive`` that ends in ``http.disconnect`` (the REST and the MCP configurations)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton.mcp._http import _ScreenedMessages
from prefect_baton.rest._http import BatonMiddleware
from prefect_baton.rest.keys import create_key
from tests.mcp.conftest import stop

from .conftest import row_counts
from .test_served_body_limit import start


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str, str]]:
    """``baton serve`` over a SQLite ledger: (port, ledger URL, a key's secret)."""
    tmp_path = tmp_path_factory.mktemp("incomplete")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    LedgerStore(url).close()
    key, _ = create_key(url, org="org-incomplete", principal="alice", role="agent")
    proc, port = start(["--ledger-url", url, "serve"], None, tmp_path / "server.log")
    try:
        yield port, url, key
    finally:
        stop(proc)


def _head(key: str, framing: str) -> bytes:
    return (
        "POST /v1/leases HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
    ).encode()


def _cut_by_length(key: str, body: bytes) -> bytes:
    """The whole JSON document, one byte short of the announced length."""
    return _head(key, f"Content-Length: {len(body) + 1}") + body


def _cut_chunked(key: str, body: bytes) -> bytes:
    """The whole JSON document in one chunk, without the final ``0`` chunk."""
    return _head(key, "Transfer-Encoding: chunked") + b"%x\r\n%s\r\n" % (len(body), body)


@pytest.mark.parametrize("cut", [_cut_by_length, _cut_chunked], ids=["content-length", "chunked"])
def test_a_body_cut_short_by_a_close_runs_nothing(served: tuple[int, str, str], cut: Any) -> None:
    """The client sends the lease's JSON but not the body's end, then closes: no answer
    was due, and the resource is not held, nothing written to the ledger."""
    port, url, key = served
    resource = f"cut-{uuid.uuid4().hex[:8]}"
    body = json.dumps({"resource_type": "t", "resource_id": resource, "ttl_seconds": 600})
    before = row_counts(url)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(cut(key, body.encode()))
        time.sleep(0.5)
    time.sleep(1.0)
    resp = httpx.get(
        f"http://127.0.0.1:{port}/v1/leases/inspect",
        params={"resource_type": "t", "resource_id": resource},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["data"]["held"] is False, resp.text
    assert row_counts(url) == before


def _no_engines() -> Any:
    """No ledger: the requests below need none (no key is looked up for ``/mcp``)."""
    return None


WRAPPERS: dict[str, Any] = {
    "rest": lambda app: BatonMiddleware(app, _no_engines),
    "mcp": lambda app: BatonMiddleware(app, _no_engines, parse_json=False),
    "mcp-screen": _ScreenedMessages,
}


@pytest.mark.parametrize("wrapper", WRAPPERS.values(), ids=list(WRAPPERS))
def test_the_middleware_calls_no_app_for_a_body_ended_by_a_disconnect(wrapper: Any) -> None:
    """A ``receive`` giving part of a body then ``http.disconnect``: the wrapped app is
    not called and nothing is sent (the client is gone); the same for the MCP endpoint's
    screen (:class:`_ScreenedMessages`), which reads the body too."""
    called: list[bool] = []
    sent: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        called.append(True)

    messages = [
        {"type": "http.request", "body": b'{"a": 1}', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Any:
        return messages.pop(0)

    async def send(message: Any) -> None:
        sent.append(message)

    middleware = wrapper(app)
    token = AccessToken(token="t", client_id="c", scopes=[])
    scope = {
        "user": AuthenticatedUser(token),
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"20")],
    }
    asyncio.run(middleware(scope, receive, send))
    assert called == []
    assert sent == []


def _answer_then_close(port: int, data: bytes, seconds: float = 5.0) -> tuple[bytes, float]:
    """Send ``data`` (a head announcing more body than it carries) and read until the
    server closes: (what it sent, seconds until the close)."""
    start = time.monotonic()
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as sock:
        sock.sendall(data)
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return out, time.monotonic() - start


@pytest.mark.parametrize(
    ("method", "path", "status", "keyed"),
    [
        ("POST", "/v1/nope", b"404", True),
        ("PATCH", "/v1/leases", b"405", True),
        ("POST", "/nope", b"404", True),
        ("POST", "/v1/leases", b"401", False),
    ],
)
def test_no_route_is_answered_before_a_slow_body_and_the_connection_closed(
    served: tuple[int, str, str], method: str, path: str, status: bytes, keyed: bool
) -> None:
    """A request no route serves, announcing a body that is slow to come, is answered
    ``404`` or ``405`` at once (not after the whole body, or the 30 s body deadline), with
    ``Connection: close``, and the server closes the connection; so is a request refused
    before its body is read (no key: ``401``), rather than the connection kept open."""
    port, _, key = served
    auth = f"Authorization: Bearer {key}\r\n" if keyed else ""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    ).encode()
    out, seconds = _answer_then_close(port, head)
    assert out.startswith(b"HTTP/1.1 " + status), out
    assert b"\r\nconnection: close\r\n" in out.lower(), out
    assert seconds < 4, seconds
