"""``Baton(api_url=..., api_key=...)`` pointed at something that is not (quite) this REST API:
every answer it cannot use is a coded error (``VALIDATION_ERROR`` when the URL does not
serve the API, ``UNAVAILABLE`` when an operation's answer is unreadable), never a pydantic
``ValidationError``, a ``KeyError`` or a plain ``BatonError`` without one of the codes."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from prefect_baton import Baton, BatonError
from prefect_baton.errors import UnavailableError, ValidationError

ME = {"org": "acme", "principal": "alice", "role": "agent"}

#: ``(path) -> (status, headers, body)`` of the fake server.
Answer = Callable[[str], tuple[int, dict[str, str], bytes]]


def _json(status: int, body: Any) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(body).encode()


@pytest.fixture
def fake() -> Iterator[Callable[[Answer], str]]:
    """Serve ``answer`` on 127.0.0.1 and a free port (stopped after the test)."""
    servers: list[http.server.HTTPServer] = []

    def start(answer: Answer) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                """Quiet."""

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                status, headers, body = answer(self.path)
                self.send_response(status)
                for k, v in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

        server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "answer",
    [
        lambda _p: _json(200, {"data": {"foo": 1}}),
        lambda _p: _json(200, {"data": [1, 2]}),
        lambda _p: _json(200, {"data": {**ME, "scopes": "not-a-list"}}),
        lambda _p: (200, {"Content-Type": "text/html"}, b"<html>catch-all</html>"),
        lambda _p: (302, {"Location": "https://elsewhere.example/v1/me"}, b""),
        lambda _p: _json(418, {"error": {"code": "TEAPOT", "message": "short and stout"}}),
    ],
    ids=["wrong-fields", "not-an-object", "wrong-types", "html-200", "redirect", "unknown-code"],
)
def test_a_url_that_does_not_serve_the_api_is_validation_error(
    fake: Callable[[Answer], str], answer: Answer
) -> None:
    """Whatever ``GET /v1/me`` answers that is not an identity, the client says the URL does
    not serve the API (``VALIDATION_ERROR``) when it is made, before any operation."""
    with pytest.raises(ValidationError, match="does not serve the prefect-baton REST API"):
        Baton(api_url=fake(answer), api_key="bk_x")


def _api(data: Any, status: int = 200) -> Answer:
    def answer(path: str) -> tuple[int, dict[str, str], bytes]:
        if path.startswith("/v1/me"):
            return _json(200, {"data": ME, "meta": {"request_id": "r", "replayed": False}})
        return _json(status, data)

    return answer


@pytest.mark.parametrize(
    ("answer", "call"),
    [
        (_api({"data": {"weird": True}}), lambda b: b.leases.acquire("d", "c", ttl_seconds=60)),
        (_api({"data": [1]}), lambda b: b.leases.inspect("d", "c")),
        (_api({"data": {"leases": "x"}}), lambda b: b.leases.list()),
        (_api({"data": {}}), lambda b: b.handoffs.inbox()),
        (_api({"data": {"status": "released"}}), lambda b: b.leases.release_by_id("lease_x")),
        (
            _api({"data": {"leases": [{"x": 1}]}}, 201),
            lambda b: b.leases.acquire_many([("d", "1")], ttl_seconds=60),
        ),
        (_api({"data": {"events": [None]}}), lambda b: b.events.list()),
        (
            _api({"error": {"code": "CONFLICT", "message": "m", "expires_at": "soon"}}, 409),
            lambda b: b.leases.acquire("d", "c", ttl_seconds=60),
        ),
        (
            _api(
                {"error": {"code": "VERSION_CONFLICT", "message": "m", "current_version": "x"}}, 409
            ),
            lambda b: b.leases.acquire("d", "c", ttl_seconds=60, expected_version=1),
        ),
        (
            _api({"error": {"code": "TEAPOT", "message": "m"}}, 418),
            lambda b: b.leases.inspect("d", "c"),
        ),
        (_api({}, 307), lambda b: b.leases.inspect("d", "c")),
    ],
    ids=[
        "lease-fields",
        "info-not-object",
        "list-not-list",
        "inbox-missing",
        "release-by-id-partial",
        "batch-items",
        "event-null",
        "conflict-bad-expiry",
        "version-conflict-bad-number",
        "unknown-code",
        "redirect",
    ],
)
def test_an_unreadable_answer_to_an_operation_is_unavailable(
    fake: Callable[[Answer], str], answer: Answer, call: Callable[[Baton], Any]
) -> None:
    """An operation whose answer does not match the API's models is ``UNAVAILABLE`` (a coded
    error the caller can retry or report), not a pydantic error or ``KeyError``."""
    b = Baton(api_url=fake(answer), api_key="bk_x")
    try:
        with pytest.raises(BatonError) as caught:
            call(b)
        assert isinstance(caught.value, UnavailableError), repr(caught.value)
        assert "bk_x" not in str(caught.value)
    finally:
        b.close()
