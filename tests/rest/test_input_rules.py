"""The input rules of the REST API, decided once for every route (and the fast path of
``POST /v1/leases``): a JSON body naming a key twice, a query parameter given twice, an
integer query parameter not written in canonical decimal digits, and an integer body field
sent as a float are ``400 VALIDATION_ERROR`` with a precise message, a request id, and
nothing written; identifiers holding Unicode format characters are refused too."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import BaseModel
from starlette.responses import Response

from prefect_baton.errors import ValidationError
from prefect_baton.rest import _fastpath
from prefect_baton.rest._json_body import parse_json_body

from .conftest import MakeKey, data, error, row_counts

LEASE = {"resource_type": "deploy", "resource_id": "checkout", "ttl_seconds": 60}


def _json(h: dict[str, str], content_type: str = "application/json") -> dict[str, str]:
    return {**h, "content-type": content_type}


# ---------------------------------------------------------------- duplicate keys

DUPLICATES: list[tuple[str, str, bytes]] = [
    (
        "acquire: ttl twice",
        "/v1/leases",
        b'{"resource_type": "deploy", "resource_id": "x", "ttl_seconds": 10, "ttl_seconds": 600}',
    ),
    (
        "acquire: id twice",
        "/v1/leases",
        b'{"resource_type": "deploy", "resource_id": "a", "resource_id": "b", "ttl_seconds": 60}',
    ),
    (
        "checkpoint: nested in the state",
        "/v1/checkpoints",
        b'{"subject_id": "s", "kind": "k", "state": {"step": 1, "step": 2}}',
    ),
    (
        "batch: inside an array item",
        "/v1/leases/batch",
        b'{"resources": [{"resource_type": "d", "resource_id": "a", "resource_id": "b"}],'
        b' "ttl_seconds": 60}',
    ),
    (
        "escaped spelling of the same key",
        "/v1/leases",
        b'{"resource_type": "deploy", "resource_id": "x", "ttl_seconds": 60,'
        b' "ttl_second\\u0073": 600}',
    ),
]


@pytest.mark.parametrize(("label", "path", "raw"), DUPLICATES, ids=[d[0] for d in DUPLICATES])
@pytest.mark.parametrize(
    "content_type",
    # without a JSON Content-Type the body is not read as JSON at all (test_errors.py)
    ["application/json", "application/json; charset=utf-8", "application/problem+json"],
    ids=["fast-path", "fastapi", "plus-json"],
)
def test_a_key_twice_in_one_object_is_400(
    client: TestClient,
    make_key: MakeKey,
    ledger_url: str,
    label: str,
    path: str,
    raw: bytes,
    content_type: str,
) -> None:
    """A JSON object naming a key twice is refused wherever it is (top level, nested state,
    array item), however the key is spelt, through the fast path and FastAPI's handler
    alike, rather than the last value silently winning; nothing is written."""
    h = _json(make_key(), content_type)
    before = row_counts(ledger_url)
    method = "PUT" if path == "/v1/checkpoints" else "POST"
    err = error(client.request(method, path, content=raw, headers=h), 400, "VALIDATION_ERROR")
    assert err["message"].startswith("body: invalid JSON (the key '"), err
    assert err["message"].endswith("' appears twice in one object)"), err
    assert row_counts(ledger_url) == before, label


def test_the_same_key_in_different_objects_is_fine(client: TestClient, make_key: MakeKey) -> None:
    """Only a key twice in one object is refused: the same key in sibling or nested
    objects is ordinary JSON."""
    h = _json(make_key())
    raw = b'{"subject_id": "s", "kind": "k", "state": {"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]}}'
    resp = client.put("/v1/checkpoints", content=raw, headers=h)
    assert data(resp)["state"] == {"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]}


class _In(BaseModel):
    n: int


def test_the_fast_path_applies_the_json_rule_itself() -> None:
    """The fast path reads a body with the API's one JSON rule even without the
    middleware in front: a key twice raises VALIDATION_ERROR, not the last value."""
    app = FastAPI()
    seen: list[int] = []

    @app.post("/x")
    def x(request: Request, body: _In) -> Response:
        seen.append(body.n)
        return Response("ok")

    route = next(r for r in app.router.routes if isinstance(r, APIRoute))
    _fastpath.install(route)
    with TestClient(app) as c:
        assert c.post("/x", content=b'{"n": 1}', headers=_json({})).text == "ok"
        with pytest.raises(ValidationError, match="the key 'n' appears twice"):
            c.post("/x", content=b'{"n": 1, "n": 2}', headers=_json({}))
    assert seen == [1]


# ---------------------------------------------------------------- precise body messages

UNPARSEABLE: list[tuple[str, bytes, str]] = [
    ("not utf-8", b'{"resource_type": "\xff"}', "body: invalid JSON at byte 19 (not UTF-8 text)"),
    (
        "integer too long",
        b'{"ttl_seconds": 1' + b"0" * 5000 + b"}",
        "body: invalid JSON at byte 16 (an integer of more than 4300 digits)",
    ),
    ("nested too deep", b"[" * 100_000 + b"]" * 100_000, "body: invalid JSON (nested too deeply)"),
    ("trailing data", b'{"ttl_seconds": 60} x', "body: invalid JSON at byte 20 (Extra data)"),
    ("blank", b"   ", "body: invalid JSON at byte 3 (Expecting value)"),
    # literals Python's json reads but JSON (RFC 8259) has not
    ("NaN", b'{"ttl_seconds": NaN}', "body: invalid JSON (NaN is not JSON)"),
    ("Infinity", b'{"ttl_seconds": Infinity}', "body: invalid JSON (Infinity is not JSON)"),
    ("-Infinity", b'{"ttl_seconds": -Infinity}', "body: invalid JSON (-Infinity is not JSON)"),
]


@pytest.mark.parametrize(("label", "raw", "message"), UNPARSEABLE, ids=[u[0] for u in UNPARSEABLE])
@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8"])
def test_an_unparseable_body_says_what_is_wrong(
    client: TestClient,
    make_key: MakeKey,
    label: str,
    raw: bytes,
    message: str,
    content_type: str,
) -> None:
    """Invalid UTF-8, an integer Python does not read, nesting the parser cannot follow,
    trailing data: the message names the problem (and the byte where it is), never
    FastAPI's bare "There was an error parsing the body"."""
    h = _json(make_key(), content_type)
    err = error(client.post("/v1/leases", content=raw, headers=h), 400, "VALIDATION_ERROR")
    assert err["message"] == message, label


def test_parse_json_body_counts_bytes_of_the_body() -> None:
    """The byte offset counts bytes of the body as sent, after multi-byte UTF-8
    characters too."""
    with pytest.raises(ValidationError, match=r"^body: invalid JSON at byte 12 \("):
        parse_json_body('{"k": "é", x}'.encode())


# ---------------------------------------------------------------- query parameters

REPEATED = [
    "/v1/events?limit=5&limit=500",
    "/v1/events?kind=lease.acquired&kind=lease.released",
    "/v1/leases?limit=5&cursor=a&limit=5",
    "/v1/leases/inspect?resource_type=d&resource_id=a&resource_id=b",
    "/v1/handoffs?party=a&party=",
    "/v1/outcomes?subject_id=a&subject_id=a",
]


@pytest.mark.parametrize("url", REPEATED)
def test_a_query_parameter_given_twice_is_400(
    client: TestClient, make_key: MakeKey, url: str
) -> None:
    """A query parameter given twice (even with the same value, or once blank) is refused
    rather than one of the values silently taken; the message names it."""
    err = error(client.get(url, headers=make_key()), 400, "VALIDATION_ERROR")
    name = url.rsplit("&", 1)[1].split("=")[0]
    assert err["message"] == f"query parameter '{name}' is given more than once", err


@pytest.mark.parametrize("path", ["/v1/leases", "/v1/outcomes"])  # the fast path and FastAPI
def test_two_idempotency_key_headers_are_400(
    client: TestClient, make_key: MakeKey, ledger_url: str, path: str
) -> None:
    """Two ``Idempotency-Key`` headers are refused (which one counts would be a guess, as
    for two ``Authorization`` headers), and nothing is written."""
    body = (
        b'{"resource_type": "deploy", "resource_id": "x", "ttl_seconds": 60}'
        if path == "/v1/leases"
        else b'{"subject_id": "s", "status": "failed"}'
    )
    headers = [*_json(make_key()).items(), ("idempotency-key", "A"), ("idempotency-key", "B")]
    before = row_counts(ledger_url)
    resp = client.post(path, content=body, headers=headers)
    err = error(resp, 400, "VALIDATION_ERROR")
    assert err["message"] == "send one Idempotency-Key header, not several"
    assert row_counts(ledger_url) == before


NOT_UTF8 = [
    "/v1/leases/inspect?resource_type=deploy&resource_id=%ED%A0%80",
    "/v1/leases/inspect?resource_type=deploy&resource_id=%FF",
    "/v1/leases/lease_%FE",
    "/v1/outcomes?subject_id=a%C3",
]


@pytest.mark.parametrize("url", NOT_UTF8)
def test_percent_escapes_that_are_not_utf8_are_400(
    client: TestClient, make_key: MakeKey, url: str
) -> None:
    """A path or query whose percent-escapes decode to bytes that are not UTF-8 is refused,
    not read with U+FFFD in place of each bad byte (``%FF`` and ``%FE`` would name one id)."""
    method = client.delete if url.startswith("/v1/leases/lease_") else client.get
    err = error(method(url, headers=make_key()), 400, "VALIDATION_ERROR")
    assert err["message"].startswith("the URL is not UTF-8 once percent-decoded"), err


def test_percent_escaped_utf8_in_an_id_still_works(client: TestClient, make_key: MakeKey) -> None:
    """Percent-escaped UTF-8 (``%C3%A9``) is read as the character it encodes."""
    resp = client.get(
        "/v1/leases/inspect?resource_type=deploy&resource_id=caf%C3%A9", headers=make_key()
    )
    assert data(resp)["resource_id"] == "caf\u00e9"


def test_distinct_query_parameters_still_work(client: TestClient, make_key: MakeKey) -> None:
    """Several different parameters are fine."""
    resp = client.get("/v1/events?limit=5&after=0", headers=make_key())
    assert data(resp)["events"] == []


NOT_DECIMAL = ["10.0", "1_0", "%2B3", "+3", "-0", "%203", "3%20", "03", "1e1", "0x10", "%D9%A3", ""]


@pytest.mark.parametrize("value", NOT_DECIMAL)
@pytest.mark.parametrize(
    ("path", "name", "message"),
    [
        ("/v1/events", "limit", "limit must be an integer from 1 to 1000"),
        ("/v1/leases", "limit", "limit must be an integer from 1 to "),
        ("/v1/handoffs", "limit", "limit must be an integer from 1 to "),
        ("/v1/outcomes", "limit", "limit must be an integer from 1 to "),
        ("/v1/events", "after", "after must be an integer from 0 to 2**63 - 1"),
    ],
)
def test_an_integer_query_parameter_takes_only_decimal_digits(
    client: TestClient, make_key: MakeKey, path: str, name: str, message: str, value: str
) -> None:
    """``limit`` and ``after`` are written in the ASCII digits 0-9 only, without a sign,
    leading zero, underscore, point, exponent, space or another script's digits (``٣``):
    anything else is refused with the message of an out-of-range value."""
    err = error(client.get(f"{path}?{name}={value}", headers=make_key()), 400, "VALIDATION_ERROR")
    assert err["message"].startswith(message), err


def test_canonical_integers_in_range_are_taken(client: TestClient, make_key: MakeKey) -> None:
    """``0`` and other canonical decimals are read as integers, in range only."""
    h = make_key()
    assert data(client.get("/v1/events?after=0&limit=1000", headers=h))["events"] == []
    too_big = client.get("/v1/events?limit=1001", headers=h)
    error(too_big, 400, "VALIDATION_ERROR")
    huge = client.get(f"/v1/events?after={'9' * 5000}", headers=h)
    assert error(huge, 400, "VALIDATION_ERROR")["message"].startswith("after must be")


# ---------------------------------------------------------------- integer body fields


def _lease(client: TestClient, h: dict[str, str]) -> dict[str, Any]:
    return dict(data(client.post("/v1/leases", json=LEASE, headers=h)))


@pytest.mark.parametrize(
    "value", [3.0, 0.0, "3", True, 1e3], ids=["3.0", "0.0", "str", "bool", "1e3"]
)
def test_integer_body_fields_take_only_json_integers(
    client: TestClient, make_key: MakeKey, ledger_url: str, value: Any
) -> None:
    """A version, an epoch, a TTL or a lifetime is a JSON integer: ``3.0`` (or ``1e3``), a
    string or a boolean is 400, naming the field, on every route, and writes nothing."""
    h = make_key()
    lease = _lease(client, h)
    lid = lease["lease_id"]
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        (
            "POST",
            "/v1/leases",
            {**LEASE, "resource_id": "y", "expected_version": value},
            "expected_version",
        ),
        ("POST", "/v1/leases", {**LEASE, "resource_id": "y", "ttl_seconds": value}, "ttl_seconds"),
        ("POST", f"/v1/leases/{lid}/renew", {"expected_version": value}, "expected_version"),
        ("POST", f"/v1/leases/{lid}/renew", {"ttl_seconds": value}, "ttl_seconds"),
        ("POST", f"/v1/leases/{lid}/release", {"expected_version": value}, "expected_version"),
        (
            "PUT",
            "/v1/checkpoints",
            {
                "subject_id": "s",
                "kind": "k",
                "state": {},
                "fence_lease_id": lid,
                "fence_epoch": value,
            },
            "fence_epoch",
        ),
        (
            "PUT",
            "/v1/checkpoints",
            {"subject_id": "s", "kind": "k", "state": {}, "ttl_seconds": value},
            "ttl_seconds",
        ),
        (
            "PUT",
            "/v1/checkpoints",
            {"subject_id": "s", "kind": "k", "state": {}, "expected_version": value},
            "expected_version",
        ),
        (
            "POST",
            "/v1/handoffs",
            {"to_principal": "bob", "subject_id": "s", "expires_in_seconds": value},
            "expires_in_seconds",
        ),
        (
            "POST",
            "/v1/outcomes",
            {"subject_id": "s", "status": "failed", "fence_lease_id": lid, "fence_epoch": value},
            "fence_epoch",
        ),
        (
            "POST",
            "/v1/leases/batch",
            {
                "resources": [
                    {"resource_type": "d", "resource_id": "z", "expected_version": value}
                ],
                "ttl_seconds": 60,
            },
            "expected_version",
        ),
    ]
    before = row_counts(ledger_url)
    for method, path, body, field in cases:
        err = error(client.request(method, path, json=body, headers=h), 400, "VALIDATION_ERROR")
        assert field in err["message"], (path, body, err)
    assert row_counts(ledger_url) == before


# ---------------------------------------------------------------- ids and request ids

FORMAT_CHARACTERS = ["\u200b", "\ufeff", "\u00ad", "\u2060", "\U000e0041", "\u202e"]


@pytest.mark.parametrize("char", FORMAT_CHARACTERS, ids=lambda c: f"U+{ord(c):04X}")
def test_ids_with_format_characters_are_400(
    client: TestClient, make_key: MakeKey, ledger_url: str, char: str
) -> None:
    """A resource id, subject id or recipient holding an invisible format character
    (category Cf) is refused by the id rule, so ``deploy`` and ``de\\u200bploy`` can never
    be two resources that print the same."""
    h = make_key()
    before = row_counts(ledger_url)
    for path, body, field in [
        ("/v1/leases", {**LEASE, "resource_id": f"check{char}out"}, "resource_id"),
        ("/v1/handoffs", {"to_principal": f"bob{char}", "subject_id": "s"}, "to_principal"),
        ("/v1/outcomes", {"subject_id": f"s{char}", "status": "failed"}, "subject_id"),
    ]:
        err = error(client.post(path, json=body, headers=h), 400, "VALIDATION_ERROR")
        assert err["message"] == (
            f"{field} must not contain invisible format characters (Unicode category Cf), "
            f"found U+{ord(char):04X}"
        ), err
    assert row_counts(ledger_url) == before


#: Evidence kinds the id rule refuses, and the end of the Python API's message.
BAD_EVIDENCE_KINDS = [
    ("fi\x01le", "must not contain control characters"),
    ("log\n", "must not contain control characters"),
    ("ci\x7frun", "must not contain control characters"),
    ("ci\x85run", "must not contain control characters or line breaks, found U+0085"),
    ("fi\u200ble", "found U+200B"),
    (" file", "must not start or end with white space, got ' file'"),
]


@pytest.mark.parametrize(("kind", "message"), BAD_EVIDENCE_KINDS)
def test_an_evidence_kind_follows_the_id_rule(
    client: TestClient, make_key: MakeKey, ledger_url: str, org: str, kind: str, message: str
) -> None:
    """An evidence item's ``kind`` is an id, as a checkpoint's ``kind`` (no control
    characters, format characters or white space at either end): the Python API and the REST
    API refuse it with ``VALIDATION_ERROR`` and write nothing (before: stored, with only a
    NUL refused), and the document's ``EvidenceIn`` states the pattern the server enforces
    (its ``uri`` and ``digest`` the NUL rule)."""
    from prefect_baton import Baton

    h = make_key()
    before = row_counts(ledger_url)
    body = {"subject_id": "s", "status": "failed", "evidence": [{"kind": kind, "uri": "u"}]}
    error(client.post("/v1/outcomes", json=body, headers=h), 400, "VALIDATION_ERROR")
    with (
        Baton(ledger_url, org=org, principal="agent-a") as b,
        pytest.raises(ValidationError) as refused,
    ):
        b.outcomes.record("s", "failed", evidence=[{"kind": kind, "uri": "u"}])
    assert refused.value.message.startswith("evidence kind must not"), refused.value.message
    assert refused.value.message.endswith(message), refused.value.message
    assert row_counts(ledger_url) == before
    item = client.get("/openapi.json").json()["components"]["schemas"]["EvidenceIn"]
    props = item["properties"]
    assert props["kind"]["pattern"] == "^[^\\x00-\\x1f\\x7f]*$", props["kind"]
    assert props["uri"]["pattern"] == "^[^\\x00]*$", props["uri"]
    assert props["digest"]["anyOf"][0]["pattern"] == "^[^\\x00]*$", props["digest"]
    body["evidence"] = [{"kind": "ci-run", "uri": "u"}]
    assert (
        data(client.post("/v1/outcomes", json=body, headers=h))["evidence"][0]["kind"] == "ci-run"
    )


def test_errors_before_the_route_carry_the_request_id(
    client: TestClient, make_key: MakeKey
) -> None:
    """Refusals the middleware answers before any route (two Authorization headers, a
    query parameter twice, a malformed body) carry ``meta.request_id``, the id of the
    ``X-Request-ID`` header, as every other error does (``error`` checks both)."""
    h = make_key()
    two = [("authorization", h["Authorization"]), ("authorization", h["Authorization"])]
    error(client.get("/v1/leases", headers=two), 400, "VALIDATION_ERROR")
    error(client.get("/v1/leases?limit=1&limit=2", headers=h), 400, "VALIDATION_ERROR")
    error(client.post("/v1/leases", content=b"{", headers=_json(h)), 400, "VALIDATION_ERROR")
