"""``baton mcp`` over stdio stopped by SIGINT (Ctrl-C) or SIGTERM: the calls already read
are answered before it exits (128 + the signal's number), as when stdin ends."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import IO, Any

import pytest

from tests.conftest import INITIALIZE

from .conftest import BATON, LEASE, _clean_env

INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def _start(ledger_url: str) -> subprocess.Popen[bytes]:
    args = [BATON, "--ledger-url", ledger_url, "--org", "acme", "--principal", "a", "mcp"]
    return subprocess.Popen(
        args,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_clean_env(),
    )


def _send(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(message).encode() + b"\n")
    proc.stdin.flush()


def _reply(out: IO[bytes]) -> dict[str, Any]:
    line = out.readline()
    assert line, "stdout ended"
    reply: dict[str, Any] = json.loads(line)
    return reply


def _initialized(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    _send(proc, INITIALIZE)
    assert _reply(proc.stdout)["id"] == 1
    _send(proc, INITIALIZED)


def _finish(proc: subprocess.Popen[bytes]) -> tuple[int, list[dict[str, Any]], str]:
    """Wait for the process; its exit status, the replies left on stdout, its stderr."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    replies = [json.loads(line) for line in proc.stdout.read().splitlines()]
    return rc, replies, proc.stderr.read().decode()


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_call_in_flight_is_answered_before_a_signal_stops_the_server(
    ledger_url: str, tmp_path: Path, signum: int, status: int
) -> None:
    """A lease acquire is in flight (the ledger's write lock is held by another
    connection) when the server gets the signal: it reads no further line, answers the
    call with its lease and fencing token once the lock is free, and exits ``status``."""
    proc = _start(ledger_url)
    _initialized(proc)
    assert proc.stdout is not None
    blocker = sqlite3.connect(str(tmp_path / "ledger.db"), isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call"}
        call["params"] = {"name": "baton_lease_acquire", "arguments": LEASE}
        _send(proc, call)
        # Lines are read in order: once this is answered, the call has been read too.
        _send(proc, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
        assert _reply(proc.stdout)["id"] == 3
        os.kill(proc.pid, signum)
        time.sleep(0.5)  # not an assertion: lets the signal land while the call waits
        after = {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}
        if proc.poll() is None:
            _send(proc, after)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    rc, replies, stderr = _finish(proc)
    assert rc == status, stderr
    assert [r["id"] for r in replies] == [2], replies
    lease = replies[0]["result"]["structuredContent"]
    assert replies[0]["result"]["isError"] is False, replies[0]
    assert lease["resource_id"] == LEASE["resource_id"]
    assert lease["lease_id"]
    assert lease["epoch"] >= 1


def test_sigint_before_any_call_exits_with_the_interrupt_status(ledger_url: str) -> None:
    """SIGINT to an initialised server with nothing in flight exits 130 at once, with no
    error on stderr (not ``INTERNAL_ERROR``) and nothing more on stdout."""
    proc = _start(ledger_url)
    _initialized(proc)
    os.kill(proc.pid, signal.SIGINT)
    rc, replies, stderr = _finish(proc)
    assert rc == 130, stderr
    assert replies == []
    assert "INTERNAL_ERROR" not in stderr
