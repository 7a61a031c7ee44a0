"""Bearer keys: stored only as hashes, listed without secrets, revocable; 401 and 403."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from prefect_baton import errors
from prefect_baton._rules.paging import encode_cursor
from prefect_baton._stores.ledger.engine import Engines
from prefect_baton.rest import ALL_SCOPES, create_app, create_key, list_keys, revoke_key
from prefect_baton.rest.keys import authenticate

from .conftest import MakeKey, data, error, row_counts

LEASE = {"resource_type": "deploy", "resource_id": "checkout", "ttl_seconds": 60}


def test_key_is_shown_once_and_only_its_hash_is_stored(ledger_url: str) -> None:
    """create_key returns bk_<random>; the ledger holds its SHA-256, never the secret."""
    secret, key = create_key(ledger_url, org="acme", principal="agent-a", scopes=["leases:read"])
    assert secret.startswith("bk_")
    assert len(secret) > 40
    assert key.scopes == ("leases:read",)
    engine = create_engine(ledger_url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM baton_api_keys")).all()
    engine.dispose()
    assert len(rows) == 1
    assert secret not in repr(rows)
    assert secret not in repr(key)
    assert secret not in repr(list_keys(ledger_url))


def test_list_and_revoke(ledger_url: str) -> None:
    """list_keys filters by org and hides revoked keys; revoke_key marks a key revoked."""
    _s1, k1 = create_key(ledger_url, org="acme", principal="a")
    _s2, k2 = create_key(ledger_url, org="acme", principal="b", role="owner")
    create_key(ledger_url, org="other", principal="c")
    assert [k.key_id for k in list_keys(ledger_url, org="acme")] == [k1.key_id, k2.key_id]
    assert k1.scopes == ALL_SCOPES
    revoked = revoke_key(ledger_url, key_id=k1.key_id)
    assert revoked.revoked
    assert [k.key_id for k in list_keys(ledger_url, org="acme")] == [k2.key_id]
    listed = list_keys(ledger_url, org="acme", include_revoked=True)
    assert [k.key_id for k in listed] == [k1.key_id, k2.key_id]
    with pytest.raises(errors.NotFoundError):
        revoke_key(ledger_url, key_id="key_nope")


@pytest.mark.parametrize("arm", ["sqlite", "postgresql"])
def test_list_keys_pages_by_cursor(
    arm: str, ledger_url: str, org: str, request: pytest.FixtureRequest
) -> None:
    """list_keys read two at a time, following next_cursor, gives every key of the org
    once, oldest first (the unpaged order), revoked ones only with include_revoked, and
    the four unrevoked keys in two full pages (the second without a next cursor); a
    malformed cursor, one of another list, and a bad limit are VALIDATION_ERROR."""
    url = ledger_url if arm == "sqlite" else str(request.getfixturevalue("pg_url"))
    made = [create_key(url, org=org, principal=f"p-{i}")[1] for i in range(5)]
    revoke_key(url, key_id=made[2].key_id)

    sizes: list[int] = []

    def walk(include_revoked: bool) -> list[str]:
        out: list[str] = []
        sizes.clear()
        cursor = None
        for _ in range(10):
            page = list_keys(url, org=org, include_revoked=include_revoked, limit=2, cursor=cursor)
            out += [k.key_id for k in page]
            sizes.append(len(page))
            cursor = page.next_cursor
            if cursor is None:
                return out
        raise AssertionError("paging did not end")

    every = [k.key_id for k in list_keys(url, org=org, include_revoked=True)]
    assert sorted(every) == sorted(k.key_id for k in made)
    assert walk(True) == every
    assert walk(False) == [k for k in every if k != made[2].key_id]
    assert sizes == [2, 2]
    assert list_keys(url, org=org, limit=4).next_cursor is None
    listed = list_keys(url, org=org, include_revoked=True)
    assert [(k.created_at_ms, k.key_id) for k in listed] == sorted(
        (k.created_at_ms, k.key_id) for k in listed
    )
    for bad in (
        "nonsense",
        "c1.!!!",
        encode_cursor("outcomes", (1, "out_x")),
        encode_cursor("keys", (1, "x\x00")),
    ):
        with pytest.raises(errors.ValidationError, match="cursor"):
            list_keys(url, org=org, cursor=bad)
    for limit in (0, 10_001):
        with pytest.raises(errors.ValidationError, match="limit"):
            list_keys(url, org=org, limit=limit)


def test_bad_key_arguments(ledger_url: str) -> None:
    """An unknown scope, a bad role or an empty principal is a ValidationError."""
    with pytest.raises(errors.ValidationError):
        create_key(ledger_url, org="acme", principal="a", scopes=["leases:admin"])
    with pytest.raises(errors.ValidationError):
        create_key(ledger_url, org="acme", principal="a", role="root")
    with pytest.raises(errors.ValidationError):
        create_key(ledger_url, org="acme", principal="")


@pytest.mark.parametrize(
    "auth",
    [None, "Bearer", "Bearer ", "Basic abc", "Bearer bk_unknown", "Bearer not-a-key", "bk_x"],
)
def test_missing_or_bad_key_is_401_and_writes_nothing(
    client: TestClient, ledger_url: str, auth: str | None
) -> None:
    """Without a valid bearer key every /v1 route is 401 and nothing is written."""
    headers = {} if auth is None else {"Authorization": auth}
    before = row_counts(ledger_url)
    r = client.post("/v1/leases", json=LEASE, headers=headers)
    error(r, 401, "UNAUTHENTICATED")
    assert r.headers["www-authenticate"] == "Bearer"
    error(client.get("/v1/events", headers=headers), 401, "UNAUTHENTICATED")
    assert row_counts(ledger_url) == before


def test_malformed_body_without_key_is_401(client: TestClient) -> None:
    """Authentication comes before body parsing: no key and bad JSON is 401."""
    h = {"content-type": "application/json"}
    error(client.post("/v1/leases", content=b"{", headers=h), 401, "UNAUTHENTICATED")


def test_revoked_key_is_401(client: TestClient, ledger_url: str, org: str) -> None:
    """A key works until revoked, then is 401 and writes nothing."""
    secret, key = create_key(ledger_url, org=org, principal="agent-a")
    h = {"Authorization": f"Bearer {secret}"}
    assert client.get("/v1/leases", headers=h).status_code == 200
    revoke_key(ledger_url, key_id=key.key_id)
    before = row_counts(ledger_url)
    error(client.post("/v1/leases", json=LEASE, headers=h), 401, "UNAUTHENTICATED")
    assert row_counts(ledger_url) == before


def test_missing_scope_is_403_and_writes_nothing(
    client: TestClient, make_key: MakeKey, ledger_url: str
) -> None:
    """A key without the route's scope is 403; read and write scopes are separate."""
    reader = make_key(scopes=["leases:read", "handoffs:read"])
    before = row_counts(ledger_url)
    error(client.post("/v1/leases", json=LEASE, headers=reader), 403, "FORBIDDEN")
    error(client.delete("/v1/leases/lease_x", headers=reader), 403, "FORBIDDEN")
    body = {"subject_id": "s", "kind": "k", "state": {}}
    error(client.put("/v1/checkpoints", json=body, headers=reader), 403, "FORBIDDEN")
    error(client.get("/v1/events", headers=reader), 403, "FORBIDDEN")
    assert row_counts(ledger_url) == before
    assert data(client.get("/v1/leases", headers=reader)) == {"leases": [], "next_cursor": None}
    assert data(client.get("/v1/handoffs", headers=reader)) == {"handoffs": [], "next_cursor": None}


def test_key_decides_the_principal(client: TestClient, make_key: MakeKey) -> None:
    """The lease is owned by the key's principal; the body cannot name another."""
    h = make_key("agent-z")
    lease = data(client.post("/v1/leases", json=LEASE, headers=h))
    assert lease["owner"] == "agent-z"
    r = client.post("/v1/leases", json={**LEASE, "owner": "agent-y"}, headers=h)
    error(r, 400, "VALIDATION_ERROR")


def test_keys_never_appear_in_logs(
    client: TestClient, ledger_url: str, org: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither a valid nor a rejected secret is written to any log record."""
    caplog.set_level(logging.DEBUG)
    secret, key = create_key(ledger_url, org=org, principal="agent-a")
    h = {"Authorization": f"Bearer {secret}"}
    client.post("/v1/leases", json=LEASE, headers=h)
    client.post("/v1/leases", json={"bad": 1}, headers=h)
    revoke_key(ledger_url, key_id=key.key_id)
    client.get("/v1/leases", headers=h)
    assert secret not in caplog.text
    assert secret[3:] not in caplog.text


# ---------------------------------------------------------------- a ledger that fails


def _read_only(path: Path) -> Engines:
    """Engines over the SQLite file ``path`` opened read-only (``mode=ro``: refused writes
    are ``SQLITE_READONLY``, as for a file without write permission, even for root)."""
    engine = create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
    return Engines(url=f"sqlite:///{path}", dialect="sqlite", write=engine, read=engine)


def _unreachable(tmp_path: Path) -> Engines:
    """Engines over a SQLite "file" that is a directory: every connection fails."""
    engine = create_engine(f"sqlite:///{tmp_path}")
    return Engines(url=f"sqlite:///{tmp_path}", dialect="sqlite", write=engine, read=engine)


def test_a_key_written_to_a_read_only_ledger_says_the_file_is_not_writable(
    ledger_url: str, tmp_path: Path
) -> None:
    """Creating or revoking a key in a SQLite ledger that cannot be written is
    ``UNAVAILABLE`` naming the file and saying it is not writable (the store's one rule,
    ``ledger_failure``), not a driver exception."""
    _secret, key = create_key(ledger_url, org="acme", principal="a")
    engines = _read_only(tmp_path / "ledger.db")
    try:
        with pytest.raises(errors.UnavailableError, match="not writable") as made:
            create_key(org="acme", principal="b", engines=engines)
        assert str(tmp_path / "ledger.db") in made.value.message
        with pytest.raises(errors.UnavailableError, match="not writable"):
            revoke_key(key_id=key.key_id, engines=engines)
    finally:
        engines.dispose()
    assert [k.key_id for k in list_keys(ledger_url)] == [key.key_id]


def test_a_key_looked_up_in_an_unreachable_ledger_names_the_cause(tmp_path: Path) -> None:
    """authenticate on a ledger it cannot open is ``UNAVAILABLE`` whose message names the
    driver's cause, not a bare "ledger database unavailable"."""
    engines = _unreachable(tmp_path)
    try:
        with pytest.raises(errors.UnavailableError) as failed:
            authenticate(engines, "bk_" + "x" * 43)
    finally:
        engines.dispose()
    assert failed.value.code == "UNAVAILABLE"
    assert failed.value.message == "ledger database unavailable: unable to open database file"


def test_served_ledger_failures_are_logged_with_their_cause(
    ledger_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The key check of a request and ``GET /v1/me`` on a ledger that cannot be opened
    answer ``503 UNAVAILABLE`` (the client is told only the request id) and the server log
    names the cause."""
    monkeypatch.setenv("BATON_KEY_CACHE_SECONDS", "300")  # the second /v1/me uses the cache
    secret, _key = create_key(ledger_url, org="acme", principal="a")
    auth = {"Authorization": f"Bearer {secret}"}
    caplog.set_level(logging.WARNING, logger="prefect_baton.rest")
    cause = "ledger database unavailable: unable to open database file"
    with TestClient(create_app(ledger_url), raise_server_exceptions=False) as client:
        other = {"Authorization": f"Bearer {create_key(ledger_url, org='acme', principal='b')[0]}"}
        assert data(client.get("/v1/me", headers=auth))["principal"] == "a"
        store = client.app.state.store  # type: ignore[attr-defined]
        good = store.engines
        broken = _unreachable(tmp_path / "unreachable")
        (tmp_path / "unreachable").mkdir()
        monkeypatch.setattr(store, "engines", broken)
        try:
            for headers in (auth, other):  # auth: key cached, /v1/me fails; other: key check
                resp = client.get("/v1/me", headers=headers)
                err = error(resp, 503, "UNAVAILABLE")
                rid = resp.headers["x-request-id"]
                assert rid in err["message"]
                assert f"UNAVAILABLE for request {rid}: {cause}" in caplog.text
        finally:
            monkeypatch.setattr(store, "engines", good)
            broken.dispose()
