"""Requests a hostile client sent, each once silently accepted or answered oddly: a fence
or lease proof given by halves, a path with a trailing slash, an unknown query parameter,
a body in UTF-16 or UTF-32, and the names in a few messages. Each is ``400
VALIDATION_ERROR`` (``404 NOT_FOUND`` for the slash) with nothing written."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from fastapi.testclient import TestClient

from prefect_baton._rules.validation import check_paired
from prefect_baton.errors import ValidationError
from prefect_baton.mcp._inputs import CheckpointSaveIn

from .conftest import MakeKey, data, error, row_counts

LEASE = {"resource_type": "deploy", "resource_id": "checkout", "ttl_seconds": 60}
STATE = {"subject_id": "s", "kind": "k", "state": {"x": 1}}
OUTCOME = {"subject_id": "s", "status": "cancelled"}
EPOCH_ALONE = "body: fence_epoch is given only with fence_lease_id (the fence)"

# ---------------------------------------------------------------- fences by halves

HALVES: list[tuple[str, str, str, dict[str, Any], str]] = [
    ("checkpoint put", "PUT", "/v1/checkpoints", {**STATE, "fence_epoch": 1}, EPOCH_ALONE),
    ("checkpoint post", "POST", "/v1/checkpoints", {**STATE, "fence_epoch": 0}, EPOCH_ALONE),
    ("outcome", "POST", "/v1/outcomes", {**OUTCOME, "fence_epoch": 1}, EPOCH_ALONE),
    (
        "handoff",
        "POST",
        "/v1/handoffs",
        {"to_principal": "bob", "subject_id": "s", "lease_execution_key": "run-1"},
        "body: lease_execution_key is given only with lease_id (the lease proof)",
    ),
]


@pytest.mark.parametrize(("label", "method", "path", "body", "message"), HALVES)
def test_a_fence_by_halves_is_refused(
    client: TestClient,
    make_key: MakeKey,
    ledger_url: str,
    label: str,
    method: str,
    path: str,
    body: dict[str, Any],
    message: str,
) -> None:
    """An epoch without its lease id (a lease proof's execution key without its lease) is
    ``400`` and writes nothing: before, the write went through unfenced."""
    h = make_key()
    before = row_counts(ledger_url)
    resp = client.request(method, path, json=body, headers=h)
    assert error(resp, 400, "VALIDATION_ERROR")["message"] == message, label
    assert row_counts(ledger_url) == before, label


def test_a_fence_by_its_lease_alone_still_takes_the_leases_epoch(
    client: TestClient, make_key: MakeKey
) -> None:
    """``fence_lease_id`` alone fences with the lease's own epoch, as documented."""
    h = make_key()
    lease = data(client.post("/v1/leases", json=LEASE, headers=h))
    body = {**STATE, "fence_lease_id": lease["lease_id"], "fence_epoch": None}
    assert client.put("/v1/checkpoints", json=body, headers=h).status_code == 200
    outcome = {**OUTCOME, "fence_lease_id": lease["lease_id"]}
    recorded = data(client.post("/v1/outcomes", json=outcome, headers=h))
    assert recorded["fence_epoch"] == lease["epoch"]


def test_the_pairing_rule_is_the_mcp_tools_rule() -> None:
    """One rule: both or neither for the MCP tools' ``lease_id`` + ``epoch``, the lead
    alone allowed where the follower defaults to the lead's own."""
    with pytest.raises(ValidationError, match="are given together"):
        check_paired(("lease_id", "l"), ("epoch", None), "the fence")
    check_paired(("fence_lease_id", "l"), ("fence_epoch", None), "the fence", lead_alone=True)
    with pytest.raises(ValidationError, match=r"^fence_epoch is given only with"):
        check_paired(("fence_lease_id", None), ("fence_epoch", 2), "the fence", lead_alone=True)
    with pytest.raises(pydantic.ValidationError, match="lease_id and epoch are given together"):
        CheckpointSaveIn.model_validate({**STATE, "epoch": 1})


# ---------------------------------------------------------------- trailing slashes


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/leases/"), ("GET", "/v1/me/"), ("GET", "/v1/handoffs/")],
)
def test_a_trailing_slash_is_not_found_not_redirected(
    client: TestClient, make_key: MakeKey, method: str, path: str
) -> None:
    """No ``307`` to the ``Host`` the client sent: the path is unknown, ``404 NOT_FOUND``
    in the error envelope."""
    h = {**make_key(), "Host": "evil.example"}
    resp = client.request(method, path, json=LEASE, headers=h, follow_redirects=False)
    error(resp, 404, "NOT_FOUND")
    assert "location" not in resp.headers


# ---------------------------------------------------------------- unknown query parameters

UNKNOWN_QUERY: list[tuple[str, str, str]] = [
    (
        "GET",
        "/v1/events?limit=1&resource_typ=x",
        "unknown query parameter 'resource_typ' (did you mean 'resource_type'?)",
    ),
    (
        "GET",
        "/v1/leases?bogus=1",
        "unknown query parameter 'bogus' (this route takes 'cursor', 'include_ended', "
        "'limit', 'owner', 'resource_type')",
    ),
    ("GET", "/v1/me?x=1", "unknown query parameter 'x' (this route takes none)"),
    ("GET", "/v1/handoffs?parti=*", "unknown query parameter 'parti' (did you mean 'party'?)"),
    (
        "GET",
        "/v1/checkpoints?subject_id=s&kind=k&principle=p",
        "unknown query parameter 'principle' (did you mean 'principal'?)",
    ),
    ("POST", "/v1/leases?dry_run=1", "unknown query parameter 'dry_run' (this route takes none)"),
    ("DELETE", "/v1/leases/l-1?force=1", "unknown query parameter 'force' (this route takes none)"),
]


@pytest.mark.parametrize(("method", "path", "message"), UNKNOWN_QUERY)
def test_an_unknown_query_parameter_is_refused(
    client: TestClient, make_key: MakeKey, ledger_url: str, method: str, path: str, message: str
) -> None:
    """A misspelt filter would widen the answer silently; it is ``400`` naming the
    parameter (and the closest known one), on every route, the fast path's too."""
    h = make_key(role="owner")
    before = row_counts(ledger_url)
    body = LEASE if method == "POST" else None
    resp = client.request(method, path, json=body, headers=h)
    assert error(resp, 400, "VALIDATION_ERROR")["message"] == message
    assert row_counts(ledger_url) == before


def test_known_query_parameters_still_pass(client: TestClient, make_key: MakeKey) -> None:
    h = make_key()
    assert client.get("/v1/events?limit=1&resource_type=d&resource_id=x", headers=h).is_success
    assert client.get("/v1/leases?include_ended=true&limit=5", headers=h).is_success


# ---------------------------------------------------------------- bodies not in UTF-8

LEASE_TEXT = '{"resource_type": "deploy", "resource_id": "checkout", "ttl_seconds": 60}'


@pytest.mark.parametrize(
    ("encoding", "at"), [("utf-16", 0), ("utf-16-le", 1), ("utf-16-be", 0), ("utf-32-le", 1)]
)
def test_a_body_in_utf16_or_utf32_is_not_utf8(
    client: TestClient, make_key: MakeKey, ledger_url: str, encoding: str, at: int
) -> None:
    """``json.loads`` of bytes reads UTF-16 and UTF-32; the API reads UTF-8 only."""
    h = {**make_key(), "content-type": "application/json"}
    before = row_counts(ledger_url)
    for path in ("/v1/leases", "/v1/checkpoints"):
        resp = client.post(path, content=LEASE_TEXT.encode(encoding), headers=h)
        message = error(resp, 400, "VALIDATION_ERROR")["message"]
        assert message == f"body: invalid JSON at byte {at} (not UTF-8 text)"
    assert row_counts(ledger_url) == before


# ---------------------------------------------------------------- messages


def test_messages_name_the_parameter_as_sent(client: TestClient, make_key: MakeKey) -> None:
    """An ``Idempotency-Key`` with a control character names the header; a query value of
    the wrong type names the parameter without FastAPI's ``query.`` location."""
    h = make_key()
    resp = client.post("/v1/leases", json=LEASE, headers={**h, "Idempotency-Key": "a\x01b"})
    message = error(resp, 400, "VALIDATION_ERROR")["message"]
    assert message == "Idempotency-Key must not contain control characters"
    resp = client.get("/v1/leases?include_ended=maybe", headers=h)
    message = error(resp, 400, "VALIDATION_ERROR")["message"]
    assert message.startswith("include_ended: Input should be a valid boolean"), message


# ---------------------------------------------------------------- bodies where none is taken


def test_a_body_on_a_route_that_takes_none_is_refused(
    client: TestClient, make_key: MakeKey, ledger_url: str
) -> None:
    """A JSON body sent to a route that takes none (a release by id, a checkpoint delete, a
    list) is ``400`` and nothing is done: before, its fields (a wrong execution key, an
    expected version, a fence, a filter) were ignored and the request served as if
    unconditional. Without a body the same requests work."""
    h = make_key()
    lease = data(client.post("/v1/leases", json=LEASE, headers=h))
    saved = data(client.put("/v1/checkpoints", json=STATE, headers=h))
    before = row_counts(ledger_url)
    for method, path, body in [
        ("DELETE", f"/v1/leases/{lease['lease_id']}", {"execution_key": "WRONG"}),
        ("DELETE", f"/v1/checkpoints/{saved['checkpoint_id']}", {"fence_epoch": 1}),
        ("GET", "/v1/leases", {"resource_type": "zzz"}),
    ]:
        resp = client.request(method, path, json=body, headers=h)
        message = error(resp, 400, "VALIDATION_ERROR")["message"]
        assert "takes no request body" in message, (method, path)
    assert row_counts(ledger_url) == before
    assert client.get("/v1/leases", headers=h).status_code == 200
    assert client.delete(f"/v1/checkpoints/{saved['checkpoint_id']}", headers=h).status_code == 200
    assert client.delete(f"/v1/leases/{lease['lease_id']}", headers=h).status_code == 200


# ---------------------------------------------------------------- content codings


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "GZIP", "identity, gzip"])
def test_a_content_coded_body_is_415_and_writes_nothing(
    client: TestClient, make_key: MakeKey, ledger_url: str, coding: str
) -> None:
    """A body with a ``Content-Encoding`` other than ``identity`` is ``415`` with the code
    ``VALIDATION_ERROR`` naming the coding, and writes nothing, whether the body is really
    coded (before: ``400`` "invalid JSON", a misreading) or plain JSON labelled as coded
    (before: taken as plain, ``201``). ``identity`` is the body as sent."""
    import gzip
    import json

    h = {**make_key(), "content-type": "application/json", "content-encoding": coding}
    plain = json.dumps(LEASE).encode()
    before = row_counts(ledger_url)
    for body in (gzip.compress(plain), plain):
        err = error(client.post("/v1/leases", content=body, headers=h), 415, "VALIDATION_ERROR")
        assert f"Content-Encoding {coding!r} is not supported" in err["message"]
    assert row_counts(ledger_url) == before
    h["content-encoding"] = "identity"
    assert data(client.post("/v1/leases", content=plain, headers=h))["resource_id"] == "checkout"


def test_a_coded_body_is_refused_after_the_key_the_route_and_the_method(
    client: TestClient, make_key: MakeKey, ledger_url: str
) -> None:
    """The ``415`` of a coded body comes after the checks of the request itself: a key in
    the URL or no key is ``401``, an unknown path ``404`` and a method the path does not
    take ``405`` (with its ``Allow``), whatever the body's coding, as for a body over the
    size limit or malformed JSON; a request without a body is not refused for the header
    (before: ``415`` for each of them)."""
    import gzip
    import json

    h = {**make_key(), "content-type": "application/json", "content-encoding": "gzip"}
    body = gzip.compress(json.dumps(LEASE).encode())
    before = row_counts(ledger_url)
    url_key = "/v1/leases?key=bk_" + "a" * 43
    error(client.post(url_key, content=body, headers=h), 401, "UNAUTHENTICATED")
    no_key = {k: v for k, v in h.items() if k != "Authorization"}
    error(client.post("/v1/leases", content=body, headers=no_key), 401, "UNAUTHENTICATED")
    for path in ("/v1/nope", "/v1/leases/", "/nope"):
        error(client.post(path, content=body, headers=h), 404, "NOT_FOUND")
        error(client.post(path, content=b"{bad", headers=h), 404, "NOT_FOUND")
    r = client.patch("/v1/leases", content=body, headers=h)
    error(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers["allow"] == "GET, HEAD, POST"
    big = {**h, "content-length": str(10**9)}
    error(client.request("PATCH", "/v1/leases", headers=big), 405, "METHOD_NOT_ALLOWED")
    plain = {**h, "content-encoding": "identity"}
    error(client.post("/v1/nope", content=b"{bad", headers=plain), 404, "NOT_FOUND")
    # no body: the header describes nothing
    assert data(client.get("/v1/leases", headers=h))["leases"] == []
    assert client.head("/v1/leases", headers=h).status_code == 200
    assert client.get("/openapi.json", headers=h).status_code == 200
    # a body where a route takes it: 415
    error(client.post("/v1/leases", content=body, headers=h), 415, "VALIDATION_ERROR")
    error(client.request("GET", "/v1/leases", content=body, headers=h), 415, "VALIDATION_ERROR")
    assert row_counts(ledger_url) == before


def test_the_document_declares_415_on_every_operation(client: TestClient) -> None:
    """Every ``/v1`` operation documents the ``415`` a coded body gets."""
    doc = client.get("/openapi.json").json()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if path.startswith("/v1/"):
                assert "415" in op["responses"], (method, path)


@pytest.mark.parametrize("length", ["00", "000", " 0"])
def test_a_content_length_of_zero_written_with_more_digits_is_no_body(
    client: TestClient, make_key: MakeKey, length: str
) -> None:
    """``Content-Length: 00`` announces no body, as ``0`` does: a route that takes none
    answers it, and a ``Content-Encoding`` describes nothing (before: ``400`` "takes no
    request body" and ``415``, the header compared as text to ``0``)."""
    h = {**make_key(), "Content-Length": length}
    assert data(client.get("/v1/leases", headers=h))["leases"] == []
    coded = {**h, "Content-Encoding": "gzip"}
    assert data(client.get("/v1/leases", headers=coded))["leases"] == []
