"""The HTTP guard: ``Baton-Fencing-Token`` checked by a FastAPI dependency in the write's
transaction (Starlette's TestClient, and a real uvicorn server on a loopback port)."""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Connection, insert, update

from prefect_baton.fencing import (
    RESOURCE_HEADER,
    TOKEN_HEADER,
    FencingToken,
    headers,
    highest_token,
)
from prefect_baton.fencing.web import add_error_handler, fenced_connection, fencing_token
from prefect_baton.testing import ManualClock, memory_baton
from tests.fencing.conftest import UserDb

pytest.importorskip("uvicorn")


def make_app(db: UserDb, *, handler: bool = True) -> FastAPI:
    """A service deploying versions: ``PUT /deploys/{service}?version=...&writer=...``,
    guarded by the fencing dependency on ``deploy/{service}``."""
    app = FastAPI()
    app.state.paused, app.state.resume = threading.Event(), threading.Event()
    if handler:
        add_error_handler(app)
    # defaults, not Annotated aliases: this module's annotations are strings, and FastAPI
    # cannot resolve a local alias from them
    fenced = fenced_connection(db.engine, "deploy", "{service}", namespace=db.namespace)
    token_of = fencing_token("deploy", "{service}")

    @app.put("/deploys/{service}")
    def put_deploy(
        service: str,
        version: str,
        writer: str,
        conn: Connection = fenced,
        token: FencingToken = token_of,
    ) -> dict[str, Any]:
        if version == "pause":  # the holder pauses after its guard, before its write
            app.state.paused.set()
            app.state.resume.wait(60)
        conn.execute(insert(db.writes).values(token=token.epoch, writer=writer))
        conn.execute(
            update(db.deploys)
            .where(db.deploys.c.service == service)
            .values(version=f"{writer}@{token.epoch}")
        )
        if version == "boom":
            raise RuntimeError("the route failed after writing")
        return {"service": service, "version": version, "epoch": token.epoch}

    return app


def _put(client: Any, sent: dict[str, str], writer: str, version: str = "1") -> Any:
    return client.put("/deploys/svc", params={"version": version, "writer": writer}, headers=sent)


def test_paused_old_holder_is_refused_with_409(user_db: UserDb) -> None:
    """The old holder's request after the new holder's: 409 STALE_FENCE in the REST
    envelope; the new holder's write stands."""
    user_db.seed("svc")
    clock = ManualClock()
    with memory_baton(principal="worker-1", clock=clock) as b, TestClient(make_app(user_db)) as c:
        old = b.leases.acquire("deploy", "svc", ttl_seconds=60)
        assert _put(c, headers(old), "old").status_code == 200
        assert _put(c, headers(old), "old").status_code == 200  # same epoch again
        clock.advance(61)
        new = b.as_principal("worker-2").leases.acquire("deploy", "svc", ttl_seconds=60)
        assert _put(c, headers(new), "new").json()["epoch"] == new.epoch
        late = _put(c, headers(old), "old")
    assert late.status_code == 409
    body = late.json()
    assert body["error"]["code"] == "STALE_FENCE"
    assert f"token {new.epoch} has written" in body["error"]["message"]
    assert user_db.current("svc") == f"new@{new.epoch}"
    assert [w for _, w in user_db.landed()] == ["old", "old", "new"]


@pytest.mark.parametrize(
    ("sent", "status", "code", "message"),
    [
        ({}, 400, "VALIDATION_ERROR", "header is missing"),
        ({TOKEN_HEADER: "seven"}, 400, "VALIDATION_ERROR", "must be a decimal integer"),
        ({TOKEN_HEADER: "-7"}, 400, "VALIDATION_ERROR", "must be a decimal integer"),
        ({TOKEN_HEADER: str(2**53)}, 400, "VALIDATION_ERROR", "from 0 to"),
        ({TOKEN_HEADER: "7", RESOURCE_HEADER: "deploy"}, 400, "VALIDATION_ERROR", "<resource"),
        ({TOKEN_HEADER: "7", RESOURCE_HEADER: "deploy/billing"}, 409, "STALE_FENCE", "billing"),
    ],
)
def test_bad_headers_are_refused_before_the_route(
    user_db: UserDb, sent: dict[str, str], status: int, code: str, message: str
) -> None:
    """A missing, malformed or foreign token: the status and code, and nothing written."""
    user_db.seed("svc")
    with TestClient(make_app(user_db)) as c:
        resp = _put(c, sent, "w")
    assert resp.status_code == status
    assert resp.json()["error"]["code"] == code
    assert message in resp.json()["error"]["message"]
    assert user_db.landed() == []


def test_without_the_error_handler_the_status_still_holds(user_db: UserDb) -> None:
    """An app that did not call add_error_handler still answers 409 with the code."""
    user_db.seed("svc")
    with TestClient(make_app(user_db, handler=False)) as c:
        assert _put(c, headers(FencingToken("deploy", "svc", 5)), "a").status_code == 200
        resp = _put(c, headers(FencingToken("deploy", "svc", 4)), "b")
    assert resp.status_code == 409
    assert resp.json()["detail"]["code"] == "STALE_FENCE"


def test_a_failing_route_rolls_back_its_write_and_its_token(user_db: UserDb) -> None:
    """The guard and the write are one transaction: the route's error undoes both."""
    user_db.seed("svc")
    app = make_app(user_db)
    with TestClient(app, raise_server_exceptions=False) as c:
        assert _put(c, headers(FencingToken("deploy", "svc", 3)), "a").status_code == 200
        failed = _put(c, headers(FencingToken("deploy", "svc", 8)), "b", version="boom")
        assert failed.status_code == 500
        assert _put(c, headers(FencingToken("deploy", "svc", 3)), "a").status_code == 200
    assert user_db.landed() == [(3, "a"), (3, "a")]
    with user_db.engine.connect() as conn:
        assert highest_token(conn, "deploy", "svc", namespace=user_db.namespace) == 3


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """``app`` served by uvicorn on a free 127.0.0.1 port in a thread; yields its URL."""
    import uvicorn

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name="fencing-uvicorn", daemon=True)
    thread.start()
    waiting = threading.Event()
    while thread.is_alive() and not server.started:
        waiting.wait(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_real_http_many_writers_with_interleaved_tokens(user_db: UserDb) -> None:
    """Eight clients over real HTTP with interleaved tokens: the landed writes never go
    down in token, each refusal is a 409 STALE_FENCE, and a paused old holder is refused."""
    user_db.seed("svc")
    rng = random.Random(3)
    plans = {f"c{i}": sorted(rng.randint(1, 30) for _ in range(15)) for i in range(8)}
    results: dict[str, tuple[list[int], list[int]]] = {}
    failures: list[str] = []
    start = threading.Barrier(len(plans))
    with serve(make_app(user_db)) as url:

        def run(writer: str, tokens: list[int]) -> None:
            landed, refused = [], []
            with httpx.Client(base_url=url, timeout=60) as client:
                start.wait()
                for token in tokens:
                    resp = _put(client, headers(FencingToken("deploy", "svc", token)), writer)
                    if resp.status_code == 200:
                        landed.append(token)
                    elif resp.json().get("error", {}).get("code") == "STALE_FENCE":
                        refused.append(token)
                    else:
                        failures.append(f"{resp.status_code} {resp.text}")
            results[writer] = (landed, refused)

        threads = [threading.Thread(target=run, args=item) for item in plans.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        with httpx.Client(base_url=url) as client:
            top = max(t for landed, _ in results.values() for t in landed)
            zombie = _put(client, headers(FencingToken("deploy", "svc", top - 1)), "zombie")
    assert not failures, failures[:3]
    assert len(results) == len(plans)
    assert zombie.status_code == 409
    assert zombie.json()["error"]["code"] == "STALE_FENCE"
    tokens = [t for t, _ in user_db.landed()]
    assert tokens == sorted(tokens), f"a lower token wrote after a higher one: {tokens}"
    assert sorted(tokens) == sorted(t for landed, _ in results.values() for t in landed)
    refused = [t for _, r in results.values() for t in r]
    assert refused
    assert all(t < tokens[-1] for t in refused)


def test_real_http_new_holder_waits_for_a_paused_request(user_db: UserDb) -> None:
    """An old holder's request paused between its guard and its commit: the new holder's
    request waits for that commit over real HTTP, so the new holder's write lands last."""
    user_db.seed("svc")
    app = make_app(user_db)
    replies: dict[str, int] = {}
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        assert _put(client, headers(FencingToken("deploy", "svc", 1)), "old").status_code == 200

        def send(writer: str, token: int, version: str) -> None:
            sent = headers(FencingToken("deploy", "svc", token))
            replies[writer] = _put(client, sent, writer, version).status_code

        old = threading.Thread(target=send, args=("old", 1, "pause"))
        old.start()
        assert app.state.paused.wait(60)
        new = threading.Thread(target=send, args=("new", 2, "1"))
        new.start()
        new.join(1.0)  # give the new holder time to run past its guard, if it could
        app.state.resume.set()
        old.join(60)
        new.join(60)
    assert replies == {"old": 200, "new": 200}
    assert user_db.landed() == [(1, "old"), (1, "old"), (2, "new")]
    assert user_db.current("svc") == "new@2"
