"""Fixtures of the Redis authority tests: a ``redis-server`` of the test's own (on a free
loopback port, no persistence), stopped by process id; a SQLite ledger per test.

Without a ``redis-server`` binary the tests that need one are skipped, or fail with
``BATON_REQUIRE_SERVICES=1`` (as in CI).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from prefect_baton._ledger.store import LedgerStore
from prefect_baton._redis.authority import RedisAuthority, connect
from tests.conftest import REQUIRE

HOST = "127.0.0.1"


def _free_port() -> int:
    for port in range(6390, 6480):
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 6390..6479")


class RedisServer:
    """A ``redis-server`` child process on ``127.0.0.1:<port>`` without persistence.

    ``kill()`` sends SIGKILL (all data is gone), ``start()`` starts it again empty on the
    same port, ``pause()``/``resume()`` send SIGSTOP/SIGCONT. Only this process id is ever
    signalled.
    """

    def __init__(self, binary: str, port: int, workdir: Path) -> None:
        self.binary = binary
        self.port = port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--bind",
                HOST,
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection((HOST, self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh ``redis-server`` of this test, on a free port in 6390..6479."""
    binary = shutil.which("redis-server")
    if binary is None:
        msg = "redis-server is not on PATH"
        if REQUIRE:
            pytest.fail(msg + " (BATON_REQUIRE_SERVICES=1)")
        pytest.skip(msg)
    server = RedisServer(binary, _free_port(), tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[LedgerStore]:
    """A SQLite ledger of this test."""
    store = LedgerStore(f"sqlite:///{tmp_path / 'ledger.db'}")
    yield store
    store.close()


@pytest.fixture
def make_authority(
    redis_server: RedisServer, ledger: LedgerStore
) -> Iterator[Callable[..., RedisAuthority]]:
    """``make_authority(**kwargs)``: an authority on the test's server and ledger, with a
    1 s socket timeout; all are closed at the end."""
    made: list[RedisAuthority] = []

    def make(**kwargs: object) -> RedisAuthority:
        client = connect(redis_server.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        auth = RedisAuthority(client, ledger, owns_client=True, **kwargs)  # type: ignore[arg-type]
        made.append(auth)
        return auth

    yield make
    for auth in made:
        try:
            auth.close()
        except Exception:
            pass
