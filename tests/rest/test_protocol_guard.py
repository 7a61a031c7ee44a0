"""The guarded protocols of :mod:`prefect_baton.rest._protocol` (``httptools``, the default,
and the ``h11`` fallback) under uvicorn on a free loopback port, with short deadlines and a
small connection cap: half-sent heads and bodies and idle connections are closed, the cap
closes the longest-idle connection or answers 503, and malformed or overlong heads are
answered with the JSON envelope."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from prefect_baton.rest import _protocol
from prefect_baton.rest._protocol import GuardedH11Protocol, GuardedProtocol

DEADLINE = 0.3
seen: list[str] = []


async def app(scope: Any, receive: Any, send: Any) -> None:
    """``/slow`` answers after 1.5 s; every request reads its body; a disconnect is noted."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            seen.append("disconnect")
            return
        more = message.get("more_body", False)
    if scope["path"] == "/slow":
        await asyncio.sleep(1.5)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


class ShortH11(GuardedH11Protocol):
    header_timeout = DEADLINE
    body_timeout = DEADLINE
    cap = 3


PROTOCOLS: list[Any] = [ShortH11]
if hasattr(_protocol, "GuardedHttpToolsProtocol"):

    class ShortHttpTools(_protocol.GuardedHttpToolsProtocol):
        header_timeout = DEADLINE
        body_timeout = DEADLINE
        cap = 3

    PROTOCOLS.insert(0, ShortHttpTools)


def test_the_server_uses_httptools_when_installed() -> None:
    """``run_app`` serves with the httptools protocol when httptools is importable."""
    pytest.importorskip("httptools")
    assert GuardedProtocol is _protocol.GuardedHttpToolsProtocol


def test_without_httptools_the_server_uses_h11() -> None:
    """With httptools not importable, the guarded h11 protocol is the one served (checked
    in a new interpreter, so that this process's classes stay as they are)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['uvicorn.protocols.http.httptools_impl'] = None\n"
        "from prefect_baton.rest import _protocol as p\n"
        "print(p.GuardedProtocol is p.GuardedH11Protocol, hasattr(p, 'GuardedHttpToolsProtocol'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["True", "False"], out.stderr


def _serve(protocol: type[Any]) -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        http=protocol,
        log_level="error",
        h11_max_incomplete_event_size=_protocol.MAX_HEAD_BYTES,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(params=PROTOCOLS, ids=lambda p: str(p.__name__))
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    """A server with 0.3 s deadlines and at most 3 connections, for each protocol."""
    yield from _serve(request.param)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` within ``seconds`` (reading what it sends)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def _get(port: int, path: str = "/") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def test_idle_and_half_sent_heads_are_closed(port: int) -> None:
    """A connection that sends nothing, or half a request head, is closed after the header
    deadline; one that sends a whole request is answered."""
    idle = socket.create_connection(("127.0.0.1", port))
    half = socket.create_connection(("127.0.0.1", port))
    half.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    assert _closed_within(idle, 5)
    assert _closed_within(half, 5)
    idle.close()
    half.close()
    assert _get(port).startswith(b"HTTP/1.1 200")


def test_a_half_sent_body_is_closed(port: int) -> None:
    """A body that stops short of its Content-Length is cut off after the body deadline;
    the app sees a disconnect."""
    seen.clear()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        assert _closed_within(sock, 5)
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen == ["disconnect"]


def test_over_the_cap_the_longest_idle_connection_is_closed(port: int) -> None:
    """With 3 connections open (the cap), a fourth is served and the oldest idle one is
    closed; the others stay open."""
    first = socket.create_connection(("127.0.0.1", port))
    time.sleep(0.05)
    second = socket.create_connection(("127.0.0.1", port))
    second.sendall(b"GET / HTTP/1.1\r\n")  # half a head is idle too
    time.sleep(0.05)
    third = socket.create_connection(("127.0.0.1", port))
    time.sleep(0.05)
    assert _get(port).startswith(b"HTTP/1.1 200")
    assert _closed_within(first, 0.2)
    assert not _closed_within(third, 0.05)
    for s in (first, second, third):
        s.close()


def _assert_request_id(head: bytes, body: bytes) -> str:
    """The answer's ``meta.request_id``, asserting it is a request id and the one of its
    ``X-Request-ID`` header, as every other answer of the server carries."""
    headers = dict(
        line.split(b": ", 1) for line in head.lower().split(b"\r\n")[1:] if b": " in line
    )
    rid = json.loads(body)["meta"]["request_id"]
    assert re.fullmatch(r"req_[0-9a-f]{32}", rid), body
    assert headers[b"x-request-id"].decode() == rid, head
    return str(rid)


def test_over_the_cap_with_every_connection_busy_is_503(port: int) -> None:
    """When every connection is busy with a request, a connection over the cap is answered
    503 UNAVAILABLE (the JSON envelope) and closed."""
    busy = [threading.Thread(target=_get, args=(port, "/slow")) for _ in range(3)]
    for t in busy:
        t.start()
    time.sleep(0.5)
    reply = _get(port)
    for t in busy:
        t.join()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), reply[:200]
    assert json.loads(body)["error"]["code"] == "UNAVAILABLE"
    _assert_request_id(head, body)
    assert _get(port).startswith(b"HTTP/1.1 200")


def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on a new connection; everything the server sends until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        reply = b""
        try:
            while chunk := sock.recv(65536):
                reply += chunk
        except ConnectionResetError:
            pass
    return reply


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", id="malformed"),
        pytest.param(
            b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * (_protocol.MAX_HEAD_BYTES + 100),
            id="overlong",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"zz\r\nab\r\n0\r\n\r\n",
            id="bad-chunk-size",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            id="gzip-chunked",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            id="length-and-chunked",
        ),
        pytest.param(
            b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: "
            + b"a" * (_protocol.MAX_HEAD_BYTES + 100)
            + b"\r\n\r\n",
            id="overlong-complete",
        ),
        pytest.param(
            b"GET /" + b"a" * (_protocol.MAX_HEAD_BYTES + 100) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            id="overlong-target-complete",
        ),
        pytest.param(
            b"GET / HTTP/1.1\r\nHost: x\r\n"
            + b"".join(b"X-%d: %s\r\n" % (i, b"b" * 100) for i in range(200))
            + b"\r\n",
            id="many-headers-complete",
        ),
        pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="no-host"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", id="two-hosts"),
    ],
)
def test_a_malformed_or_overlong_head_is_a_json_400(port: int, data: bytes) -> None:
    """A malformed head or chunked body, more than MAX_HEAD_BYTES of a head without its
    end, or a head whose framing the two parsers take differently (head_problem: a
    Transfer-Encoding other than chunked or beside Content-Length, no Host or two) is
    answered 400 with the JSON envelope (VALIDATION_ERROR) on both protocols, at once, and
    the connection is closed."""
    reply = _exchange(port, data)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), reply[:200]
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "VALIDATION_ERROR"
    _assert_request_id(head, body)


def test_pipelined_requests_are_answered_then_the_idle_connection_closed(port: int) -> None:
    """Two requests sent at once on one keep-alive connection are both answered, in order;
    then the connection, idle, is closed after the header deadline."""
    request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request * 2)
        reply = b""
        while reply.count(b"HTTP/1.1 200") < 2:
            chunk = sock.recv(65536)
            assert chunk, reply
            reply += chunk
        started = time.monotonic()
        assert _closed_within(sock, 5)
        assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(b"GARBAGE\r\n\r\n", id="malformed-head"),
        pytest.param(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            id="malformed-chunked-body",
        ),
    ],
)
def test_a_malformed_request_after_pipelined_ones_is_answered_after_them(
    port: int, bad: bytes
) -> None:
    """A malformed head or body sent right behind requests on one connection (pipelining)
    is answered 400 only after their responses, in order: the requests before it run and
    their answers are not cut off or dropped (the app of /slow is still running when the
    parser reaches the bad request)."""
    requests = b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"
    reply = _exchange(port, requests + bad)
    statuses = [part[:3] for part in reply.split(b"HTTP/1.1 ")[1:]]
    assert statuses == [b"200", b"200", b"400"], reply[:400]
    assert json.loads(reply.rpartition(b"\r\n\r\n")[2])["error"]["code"] == "VALIDATION_ERROR"
