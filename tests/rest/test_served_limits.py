"""``baton serve`` and ``baton mcp --transport http`` as subprocesses on a free loopback
port, under a file descriptor limit of 1,024: idle connections cannot stop the server, a
request head too large gets the JSON envelope, and the log stays small."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton.rest import MAX_BODY_BYTES
from prefect_baton.rest.keys import create_key
from tests.conftest import INITIALIZE

BATON = str(Path(sys.executable).parent / "baton")
FD_LIMIT = 1024
IDLE_CONNECTIONS = 1100


@dataclass
class Served:
    """A served process: its kind (``rest`` or ``mcp``), base URL, log and a key."""

    kind: str
    base: str
    log: Path
    key: str

    @property
    def path(self) -> str:
        """The path of the keyed request: ``/v1/me`` (REST) or ``/mcp`` (MCP)."""
        return "/v1/me" if self.kind == "rest" else "/mcp"

    def keyed_request(self, **headers: str) -> httpx.Response:
        """``GET /v1/me`` (REST) or an MCP ``initialize`` (MCP), with the key."""
        h = {"Authorization": f"Bearer {self.key}", **headers}
        return self.request(self.path, list(h.items()))

    def request(
        self, path: str, headers: list[tuple[str, str]], content: bytes | None = None
    ) -> httpx.Response:
        """``GET path`` (REST) or ``POST path`` with an MCP ``initialize`` (or ``content``)."""
        if self.kind == "rest" and content is None:
            return httpx.get(f"{self.base}{path}", headers=headers, timeout=10)
        headers = [*headers, ("Accept", "application/json, text/event-stream")]
        headers.append(("Content-Type", "application/json"))
        body = content if content is not None else json.dumps(INITIALIZE).encode()
        return httpx.post(f"{self.base}{path}", headers=headers, content=body, timeout=10)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.fixture(scope="module", params=["rest", "mcp"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """``baton serve`` or ``baton mcp --transport http`` with ``ulimit -n 1024`` (one
    process per kind for the module)."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    LedgerStore(url).close()
    key, _ = create_key(url, org="org-limits", principal="alice", role="agent")
    port = _free_port()
    command = ["serve"] if request.param == "rest" else ["mcp", "--transport", "http"]
    log = tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [BATON, "--ledger-url", url, *command, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_limit_fds,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        yield Served(request.param, f"http://127.0.0.1:{port}", log, key)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


def test_idle_connections_do_not_stop_a_keyed_request(served: Served) -> None:
    """1,100 idle unauthenticated connections to a server limited to 1,024 file
    descriptors: a keyed request is still answered, and the log stays under 1 MB."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < IDLE_CONNECTIONS + 200:
        pytest.skip(f"this process may open only {hard} files")
    if soft != resource.RLIM_INFINITY and soft < IDLE_CONNECTIONS + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    idle = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            idle.append(socket.create_connection(("127.0.0.1", int(served.base.rsplit(":")[-1]))))
        resp = served.keyed_request()
        assert resp.status_code == 200, resp.text
        assert served.keyed_request().status_code == 200
    finally:
        for s in idle:
            s.close()
    assert served.log.stat().st_size < 1_000_000


def test_oversized_request_head_gets_the_json_envelope(served: Served) -> None:
    """A 100 KB Idempotency-Key (a request head over the limit, arriving in pieces as over
    a slow network) is a 400 with the JSON error envelope, not uvicorn's plain text."""
    port = int(served.base.rsplit(":")[-1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v1/leases HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: ")
        try:
            for _ in range(10):
                sock.sendall(b"k" * 10_000)
                time.sleep(0.01)
        except OSError:
            pass  # the server answered and closed before the head was complete
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), reply[:200]
    assert b"application/json" in head.lower()
    assert json.loads(body)["error"]["code"] == "VALIDATION_ERROR"


def test_a_key_outside_the_authorization_header_is_refused_and_not_logged(
    served: Served,
) -> None:
    """A bearer key in the query string or the path is 401, even with a valid key in the
    Authorization header, and never reaches the log; the valid key alone is accepted."""
    auth = [("Authorization", f"Bearer {served.key}")]
    for path in (
        f"{served.path}?api_key={served.key}",
        f"{served.path}?token=x&key={served.key.replace('_', '%5F')}",
        f"{served.path}/{served.key}",
    ):
        for headers in ([], auth):
            resp = served.request(path, headers)
            assert resp.status_code == 401, (path, resp.text)
            assert resp.json()["error"]["code"] == "UNAUTHENTICATED"
    assert served.keyed_request().status_code == 200
    log = served.log.read_text(encoding="utf-8", errors="replace")
    assert served.path in log
    assert served.key not in log
    assert served.key[3:] not in log


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "no-key"])
def test_a_websocket_upgrade_is_answered_as_a_plain_request(served: Served, keyed: bool) -> None:
    """A request asking for a WebSocket upgrade gets the answer the same request gets
    without it (the key checked, the JSON envelope), not a WebSocket handshake's
    plain-text 400 or empty 403: no route is a WebSocket. One exception: httptools stops
    parsing at an ``Upgrade`` head, so the body of a keyed MCP request carrying one never
    reaches the app: it is refused with a JSON 400 (nothing is run), not answered as the
    plain request."""
    auth = [("Authorization", f"Bearer {served.key}")] if keyed else []
    upgrade = [
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("Sec-WebSocket-Version", "13"),
    ]
    plain = served.request(served.path, auth)
    resp = served.request(served.path, [*auth, *upgrade])
    assert resp.headers["content-type"].startswith("application/json"), resp.text
    if keyed and served.kind == "mcp":
        assert plain.status_code == 200, plain.text
        assert resp.status_code == 400, resp.text
        return
    assert resp.status_code == plain.status_code != 101, resp.text
    if not keyed:
        assert resp.json()["error"] == plain.json()["error"]


def test_two_authorization_headers_are_refused(served: Served) -> None:
    """Two Authorization headers are 400 VALIDATION_ERROR (the JSON envelope), whichever
    comes last."""
    other, _ = create_key(
        f"sqlite:///{served.log.parent / 'ledger.db'}", org="org-x", principal="bob"
    )
    for pair in ((served.key, other), (other, served.key), (served.key, served.key)):
        resp = served.request(served.path, [("Authorization", f"Bearer {k}") for k in pair])
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "VALIDATION_ERROR"


def test_a_body_over_the_limit_is_413(served: Served) -> None:
    """A request body over the limit (MAX_BODY_BYTES with the default state cap: by one
    byte, by 10 %, 4 MiB) is 413 PAYLOAD_TOO_LARGE, REST and MCP alike."""
    path = "/v1/leases" if served.kind == "rest" else "/mcp"
    for size in (MAX_BODY_BYTES + 1, MAX_BODY_BYTES * 11 // 10, 4 * 1024 * 1024):
        body = b'{"x": "' + b"a" * (size - 9) + b'"}'
        assert len(body) == size
        resp = served.request(path, [("Authorization", f"Bearer {served.key}")], content=body)
        assert resp.status_code == 413, resp.text[:200]
        assert resp.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
