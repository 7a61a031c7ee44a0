"""The seed service's concurrency promises over real HTTP: the app served by uvicorn on
127.0.0.1 and a free port, started and stopped by the fixture."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from prefect_baton.rest import create_app, create_key

from .conftest import row_counts

LEASE = {"resource_type": "deploy", "resource_id": "checkout-service", "ttl_seconds": 600}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(ledger_url: str) -> Iterator[str]:
    """Base URL of the app served by uvicorn in a thread; stopped after the test."""
    port = _free_port()
    config = uvicorn.Config(
        create_app(ledger_url), host="127.0.0.1", port=port, log_level="info", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    ready = threading.Event()
    while thread.is_alive() and not server.started:
        ready.wait(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert not thread.is_alive()


def _race(n: int, call: Callable[[int], httpx.Response]) -> list[httpx.Response]:
    """Run ``call(i)`` for i in 0..n-1 on n threads released together."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        out[i] = call(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _auth(ledger_url: str, org: str, principal: str) -> dict[str, str]:
    secret, _ = create_key(ledger_url, org=org, principal=principal)
    return {"Authorization": f"Bearer {secret}"}


def test_twenty_clients_race_for_one_lease(served: str, ledger_url: str, org: str) -> None:
    """Exactly one 201 and nineteen 409; a loser's DELETE of the winner's id is 404."""
    heads = [_auth(ledger_url, org, f"agent-{i}") for i in range(20)]

    def acquire(i: int) -> httpx.Response:
        with httpx.Client(base_url=served, headers=heads[i], timeout=60) as c:
            return c.post("/v1/leases", json=LEASE)

    responses = _race(20, acquire)
    assert Counter(r.status_code for r in responses) == {201: 1, 409: 19}
    winner = next(i for i, r in enumerate(responses) if r.status_code == 201)
    lease_id = responses[winner].json()["data"]["lease_id"]
    for r in responses:
        if r.status_code == 409:
            assert r.json()["error"]["code"] == "CONFLICT"
    loser = (winner + 1) % 20
    with httpx.Client(base_url=served, headers=heads[loser], timeout=60) as c:
        r = c.delete(f"/v1/leases/{lease_id}")
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "NOT_FOUND"
    with httpx.Client(base_url=served, headers=heads[winner], timeout=60) as c:
        assert c.delete(f"/v1/leases/{lease_id}").status_code == 200


def test_twelve_saves_of_one_checkpoint_leave_one_row(
    served: str, ledger_url: str, org: str
) -> None:
    """Twelve concurrent saves of one checkpoint all succeed and leave one row, version 12."""
    h = _auth(ledger_url, org, "agent-a")

    def save(i: int) -> httpx.Response:
        body = {"subject_id": "ticket-1", "kind": "progress", "state": {"i": i}}
        with httpx.Client(base_url=served, headers=h, timeout=60) as c:
            return c.put("/v1/checkpoints", json=body)

    responses = _race(12, save)
    assert [r.status_code for r in responses] == [200] * 12
    assert row_counts(ledger_url)["baton_checkpoints"] == 1
    with httpx.Client(base_url=served, headers=h, timeout=60) as c:
        params = {"subject_id": "ticket-1", "kind": "progress"}
        assert c.get("/v1/checkpoints", params=params).json()["data"]["version"] == 12


def test_twelve_resolves_of_one_handoff(served: str, ledger_url: str, org: str) -> None:
    """Exactly one of twelve concurrent resolves succeeds, the rest are 404 or 409."""
    a, b = _auth(ledger_url, org, "agent-a"), _auth(ledger_url, org, "agent-b")
    with httpx.Client(base_url=served, headers=a, timeout=60) as c:
        body = {"to_principal": "agent-b", "subject_id": "ticket-1"}
        hid = c.post("/v1/handoffs", json=body).json()["data"]["handoff_id"]

    def resolve(i: int) -> httpx.Response:
        status = "accepted" if i % 2 else "rejected"
        with httpx.Client(base_url=served, headers=b, timeout=60) as c:
            return c.post(f"/v1/handoffs/{hid}/resolve", json={"status": status})

    responses = _race(12, resolve)
    codes = Counter(r.status_code for r in responses)
    assert codes[200] == 1
    assert set(codes) <= {200, 404, 409}
    with httpx.Client(base_url=served, headers=a, timeout=60) as c:
        events = c.get("/v1/events").json()["data"]["events"]
    resolved = [e for e in events if e["kind"] in ("handoff.accepted", "handoff.rejected")]
    assert len(resolved) == 1


def test_served_app_keeps_keys_out_of_logs(
    served: str, ledger_url: str, org: str, caplog: pytest.LogCaptureFixture
) -> None:
    """uvicorn's logs of real requests (good and bad key) never contain the secret."""
    caplog.set_level(logging.DEBUG)
    secret, _ = create_key(ledger_url, org=org, principal="agent-a")
    with httpx.Client(base_url=served, timeout=60) as c:
        assert c.get("/v1/leases", headers={"Authorization": f"Bearer {secret}"}).is_success
        assert c.get("/v1/leases", headers={"Authorization": "Bearer bk_wrong"}).status_code == 401
        r = c.post(
            "/v1/leases",
            content=b"{",
            headers={"Authorization": f"Bearer {secret}", "content-type": "application/json"},
        )
        assert r.status_code == 400
    assert "/v1/leases" in caplog.text
    assert secret not in caplog.text


def test_module_entry_point_serves(ledger_url: str, org: str) -> None:
    """``python -m prefect_baton.rest --port P`` serves the API until terminated."""
    port = _free_port()
    secret, _ = create_key(ledger_url, org=org, principal="agent-a")
    argv = ["-m", "prefect_baton.rest", "--port", str(port), "--ledger-url", ledger_url]
    proc = subprocess.Popen(
        [sys.executable, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        pause = threading.Event()
        up = False
        for _ in range(1500):
            if proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    up = True
                    break
            except OSError:
                pause.wait(0.02)
        assert up, "the server did not come up"
        h = {"Authorization": f"Bearer {secret}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=h, timeout=60) as c:
            assert c.post("/v1/leases", json=LEASE).status_code == 201
            assert c.get("/v1/leases").json()["data"]["leases"][0]["owner"] == "agent-a"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert secret not in out
