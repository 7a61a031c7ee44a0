"""``baton serve`` as a real process, broken from outside: SIGSTOPped past a remote lease's TTL
(the lease is reported lost, fenced writes are refused, another principal gets it) and
SIGKILLed among concurrent writes, then restarted on the same ledger (every retry with its
``Idempotency-Key`` answers without a 5xx, and each key is written exactly once)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefect_baton import Baton, LeaseLostError, StaleFenceError
from prefect_baton._client.keeper import LeaseKeeper
from prefect_baton.rest import create_key

BATON = str(Path(sys.executable).with_name("baton"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """``baton serve`` on one port and ledger; ``start``/``kill``/``stop`` by pid."""

    def __init__(self, ledger_url: str, log: Path) -> None:
        self.ledger_url = ledger_url
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server and wait until it answers."""
        argv = [BATON, "--ledger-url", self.ledger_url, "serve", "--port", str(self.port)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                httpx.get(f"{self.url}/openapi.json", timeout=1)
                return
            except httpx.HTTPError:
                threading.Event().wait(0.05)
        raise AssertionError(f"baton serve did not answer: {self.log.read_text()}")

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the server process."""
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the server and reap it."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGCONT (in case it is stopped), then SIGTERM; SIGKILL if it does not end."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGCONT)
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture
def served(ledger_url: str, tmp_path: Path) -> Iterator[Served]:
    """``baton serve`` over the test's ledger, stopped by pid after the test."""
    server = Served(ledger_url, tmp_path / "serve.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_remote_lease_is_lost_while_the_server_is_stopped_past_its_ttl(
    served: Served, ledger_url: str, org: str
) -> None:
    """Server SIGSTOPped past the TTL, then SIGCONT: the handle reports the lease lost, a
    fenced checkpoint is STALE_FENCE, leaving the block raises LEASE_LOST, and another
    principal acquires the resource with a higher epoch."""
    alice_key, _ = create_key(ledger_url, org=org, principal="alice")
    bob_key, _ = create_key(ledger_url, org=org, principal="bob")
    alice = Baton(api_url=served.url, api_key=alice_key)
    bob = Baton(api_url=served.url, api_key=bob_key)
    pause = threading.Event()
    seen: list[LeaseKeeper] = []

    def hold_through_a_stop() -> None:
        with alice.lease("deploy", "checkout", ttl_seconds=10) as held:
            seen.append(held)
            stopped = time.monotonic()
            served.signal(signal.SIGSTOP)
            try:
                deadline = stopped + 120
                while not held.lost and time.monotonic() < deadline:
                    pause.wait(0.2)
                # the holder learns of the loss at its renew deadline (2/3 of the TTL);
                # the server lets the lease lapse only at the TTL: stay stopped past it
                pause.wait(max(0.0, stopped + 10.5 - time.monotonic()))
            finally:
                served.signal(signal.SIGCONT)
            assert held.lost
            with pytest.raises(StaleFenceError):
                alice.checkpoints.save("checkout", "rollback", {"step": 2}, fence=held)

    try:
        with pytest.raises(LeaseLostError):
            hold_through_a_stop()
        assert alice.checkpoints.get("checkout", "rollback") is None
        taken = bob.leases.acquire("deploy", "checkout", ttl_seconds=60)
        assert taken.epoch > seen[0].epoch
    finally:
        alice.close()
        bob.close()


def test_sigkill_among_concurrent_writes_then_restart_writes_each_key_once(
    served: Served, ledger_url: str, org: str
) -> None:
    """8 writers save checkpoints with one Idempotency-Key per save while the server is
    SIGKILLed and restarted: no answer is a 5xx, and after every unanswered save is retried
    with its key, the checkpoint's history holds each key's write exactly once."""
    keys = [create_key(ledger_url, org=org, principal=f"w{i}")[0] for i in range(8)]
    sent: list[list[tuple[str, int]]] = [[] for _ in keys]  # (Idempotency-Key, n) per writer
    statuses: list[Any] = []
    stop = threading.Event()

    def save(http: httpx.Client, i: int, n: int) -> httpx.Response:
        headers = {"Authorization": f"Bearer {keys[i]}", "Idempotency-Key": f"w{i}-{n}"}
        body = {"subject_id": "report", "kind": "draft", "state": {"n": n}}
        return http.put(f"{served.url}/v1/checkpoints", json=body, headers=headers)

    def writer(i: int) -> None:
        with httpx.Client(timeout=10) as http:
            n = 0
            while not stop.is_set():
                n += 1
                sent[i].append((f"w{i}-{n}", n))
                try:
                    statuses.append(save(http, i, n).status_code)
                except httpx.HTTPError:
                    statuses.append("no answer")
                    stop.wait(0.02)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(keys))]
    for t in threads:
        t.start()
    try:
        while len(statuses) < 40:
            stop.wait(0.02)
        served.kill()
        served.start()
        while len(statuses) < 80:
            stop.wait(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not [s for s in statuses if isinstance(s, int) and s >= 500], statuses
    assert "no answer" in statuses  # the kill did interrupt requests
    with httpx.Client(timeout=30) as http:
        for i, writes in enumerate(sent):
            for _key, n in writes:  # a retry of every save: replayed or written now
                resp = save(http, i, n)
                assert resp.status_code == 200, resp.text
            written: list[int] = []
            cursor: str | None = None
            while True:  # every page of the history (a page holds at most 16 versions)
                params: dict[str, Any] = {"subject_id": "report", "kind": "draft", "limit": 100}
                if cursor is not None:
                    params["cursor"] = cursor
                history = http.get(
                    f"{served.url}/v1/checkpoints/history",
                    params=params,
                    headers={"Authorization": f"Bearer {keys[i]}"},
                )
                assert history.status_code == 200, history.text
                page = history.json()["data"]
                written += [c["state"]["n"] for c in page["checkpoints"]]
                cursor = page["next_cursor"]
                if cursor is None:
                    break
            assert sorted(written) == [n for _k, n in writes]
