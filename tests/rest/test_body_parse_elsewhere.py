"""A large JSON body is parsed off the event loop: while one request's body is being
parsed, the other clients of the same server process are answered."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
import starlette.requests

from prefect_baton.rest import _http, _json_body, create_app

from .conftest import MakeKey, data, error

#: How long the held parse waits to be let go (s): long enough that only a server which
#: answers nothing meanwhile makes it give up (then the test fails, it does not hang).
HOLD_SECONDS = 20


#: A route answering a large body (``PUT /v1/checkpoints``: FastAPI's own handler;
#: ``POST /v1/leases``: the fast path, which hands a body it cannot take to FastAPI's),
#: the body, and a word of the validation error it gets.
LARGE: list[tuple[str, str, bytes, str]] = [
    (
        "PUT",
        "/v1/checkpoints",
        b'{"subject_id": "s", "kind": "k", "state": {"n": [' + b"1," * 100_000 + b'1]}, "x": 1}',
        "x",
    ),
    (
        "POST",
        "/v1/leases",
        b'{"resource_type": "deploy", "padding": [' + b"1," * 100_000 + b"1]}",
        "resource_id",
    ),
]


@pytest.mark.parametrize(("method", "path", "large", "word"), LARGE, ids=[r[1] for r in LARGE])
def test_other_requests_are_answered_while_a_large_body_is_parsed(
    ledger_url: str,
    make_key: MakeKey,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    path: str,
    large: bytes,
    word: str,
) -> None:
    """The parse of a large body is held until another request of the same app has
    been answered: that request gets its answer (its own data) and the held one then
    gets its own (the body's validation error), so the parse did not hold up the
    server. Parsed on the event loop, the held parse would block the other request
    until it gave up. The body is parsed once: the route reads the middleware's document
    (FastAPI would parse it again on the event loop)."""
    parse = _json_body.parse_json_body
    parsing = threading.Event()
    let_go = threading.Event()
    released: list[bool] = []
    reparsed: list[int] = []

    def held_parse(raw: bytes) -> Any:
        if len(raw) == len(large):
            parsing.set()
            released.append(let_go.wait(HOLD_SECONDS))
        return parse(raw)

    def starlette_loads(raw: str | bytes) -> Any:
        reparsed.append(len(raw))
        return json.loads(raw)

    monkeypatch.setattr(_http, "parse_json_body", held_parse)
    monkeypatch.setattr(_json_body, "parse_json_body", held_parse)
    monkeypatch.setattr(starlette.requests, "json", SimpleNamespace(loads=starlette_loads))
    auth = make_key()
    app = create_app(ledger_url)

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app)
        answers: dict[str, httpx.Response] = {}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://baton", timeout=3 * HOLD_SECONDS
        ) as http:

            async def send_large() -> None:
                headers = {**auth, "content-type": "application/json"}
                answers["large"] = await http.request(method, path, content=large, headers=headers)

            async with anyio.create_task_group() as tg:
                tg.start_soon(send_large)
                await anyio.to_thread.run_sync(parsing.wait, HOLD_SECONDS)
                answers["small"] = await http.get("/v1/me", headers=auth)
                let_go.set()
        return answers["small"], answers["large"]

    try:
        small, large_answer = anyio.run(scenario)
    finally:
        let_go.set()
        app.state.store.close()
    assert data(small)["principal"] == "agent-a"
    assert released == [True], "the held parse blocked the other request"
    assert len(large) not in reparsed, "the body was parsed again"
    err = error(large_answer, 400, "VALIDATION_ERROR")
    assert word in err["message"]
