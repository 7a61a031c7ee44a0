"""A large JSON body is parsed off the event loop: while one request's body is being
parsed, the other clients of the same server process are answered."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from prefect_baton.rest import _http, create_app

from .conftest import MakeKey, data, error

#: How long the held parse waits to be let go (s): long enough that only a server which
#: answers nothing meanwhile makes it give up (then the test fails, it does not hang).
HOLD_SECONDS = 20


def test_other_requests_are_answered_while_a_large_body_is_parsed(
    ledger_url: str, make_key: MakeKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parse of a large body is held until another request of the same app has
    been answered: that request gets its answer (its own data) and the held one then
    gets its own (the body's validation error), so the parse did not hold up the
    server. Parsed on the event loop, the held parse would block the other request
    until it gave up."""
    large = b'{"resource_type": "deploy", "padding": [' + b"1," * 100_000 + b"1]}"
    parse = _http.parse_json_body
    parsing = threading.Event()
    let_go = threading.Event()
    released: list[bool] = []

    def held_parse(raw: bytes) -> Any:
        if len(raw) == len(large):
            parsing.set()
            released.append(let_go.wait(HOLD_SECONDS))
        return parse(raw)

    monkeypatch.setattr(_http, "parse_json_body", held_parse)
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
                answers["large"] = await http.post("/v1/leases", content=large, headers=headers)

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
    err = error(large_answer, 400, "VALIDATION_ERROR")
    assert "resource_id" in err["message"]
