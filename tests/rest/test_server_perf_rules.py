"""The REST server's settings and its bearer-key cache: ``create_app`` takes the Redis
authority from ``BATON_REDIS_URL``; a key revoked in the server's process is refused at
once, one revoked by another process (``baton keys revoke``) once the cached entry is
older than ``BATON_KEY_CACHE_SECONDS`` (``0``: at once). The clock is the test's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from prefect_baton import errors
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton.rest import create_app, create_key, revoke_key
from prefect_baton.rest.keys import KeyCache
from tests.conftest import REDIS_URL, require_redis

from .conftest import error, row_counts

LEASE = {"resource_type": "deploy", "resource_id": "checkout", "ttl_seconds": 60}


class Clock:
    """A monotonic clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _revoke_in_another_process(ledger_url: str, key_id: str) -> None:
    """``baton keys revoke`` as a separate OS process (not this process's revoke_key)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    env["BATON_LEDGER_URL"] = ledger_url
    run = subprocess.run(
        [sys.executable, "-m", "prefect_baton.cli", "keys", "revoke", key_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr


# ------------------------------------------------------------------- settings


def test_create_app_takes_the_redis_url_from_the_environment(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``redis_url``, ``BATON_REDIS_URL`` chooses Redis as the authority (as for
    ``Baton``), with ``BATON_REDIS_ACK``; without either the ledger is the authority."""
    from prefect_baton._stores.redis.authority import RedisAuthority

    require_redis()
    monkeypatch.delenv("BATON_REDIS_URL", raising=False)
    plain = create_app(ledger_url)
    assert isinstance(plain.state.authority, LedgerStore)
    plain.state.store.close()

    monkeypatch.setenv("BATON_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("BATON_REDIS_ACK", "ledger")
    secret, _key = create_key(ledger_url, org="acme", principal="agent-a")
    with TestClient(create_app(ledger_url), raise_server_exceptions=False) as client:
        authority = client.app.state.authority  # type: ignore[attr-defined]
        assert isinstance(authority, RedisAuthority)
        assert authority.ack == "ledger"
        h = {"Authorization": f"Bearer {secret}"}
        r = client.post("/v1/leases", json={**LEASE, "resource_id": os.urandom(8).hex()}, headers=h)
        assert r.status_code == 201, r.text
        assert client.delete(f"/v1/leases/{r.json()['data']['lease_id']}", headers=h).is_success


def test_bad_key_cache_setting_is_validation_error(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A negative or non-numeric ``BATON_KEY_CACHE_SECONDS`` is VALIDATION_ERROR from
    ``create_app`` and no ledger is created."""
    url = f"sqlite:///{os.path.join(tmp_path, 'never.db')}"
    for value in ("-1", "soon", "301"):
        monkeypatch.setenv("BATON_KEY_CACHE_SECONDS", value)
        with pytest.raises(errors.ValidationError) as ei:
            create_app(url)
        assert ei.value.code == "VALIDATION_ERROR"
        assert "BATON_KEY_CACHE_SECONDS" in ei.value.message
    assert not os.path.exists(os.path.join(tmp_path, "never.db"))


# ------------------------------------------------------------------- the key cache


def test_revocation_elsewhere_is_seen_once_the_entry_ages_out(ledger_url: str) -> None:
    """A key revoked by another process is still answered from the cache while its entry
    is younger than ``ttl_seconds``, and refused from then on (clock moved by hand)."""
    clock = Clock()
    cache = KeyCache(5, clock=clock)
    store = LedgerStore(ledger_url)
    try:
        secret, key = create_key(ledger_url, org="acme", principal="agent-a")
        assert cache.lookup(store.engines, secret) == key
        _revoke_in_another_process(ledger_url, key.key_id)
        clock.now += 4.9
        assert cache.lookup(store.engines, secret) == key
        clock.now += 0.1
        assert cache.lookup(store.engines, secret) is None
        clock.now += 100  # a refused key is never cached
        assert cache.lookup(store.engines, secret) is None
    finally:
        store.close()


def test_zero_disables_the_cache(ledger_url: str) -> None:
    """With ``ttl_seconds=0`` every lookup asks the ledger: a revocation by another
    process is refused at once, without the clock moving."""
    cache = KeyCache(0, clock=Clock())
    store = LedgerStore(ledger_url)
    try:
        secret, key = create_key(ledger_url, org="acme", principal="agent-a")
        assert cache.lookup(store.engines, secret) == key
        assert cache.get(secret) is None
        _revoke_in_another_process(ledger_url, key.key_id)
        assert cache.lookup(store.engines, secret) is None
    finally:
        store.close()


def test_revocation_in_this_process_applies_at_once(ledger_url: str) -> None:
    """``revoke_key`` in the cache's process drops the cached key at once (the clock does
    not move), also a lookup token taken before the revocation."""
    cache = KeyCache(300, clock=Clock())
    store = LedgerStore(ledger_url)
    try:
        secret, key = create_key(ledger_url, org="acme", principal="agent-a")
        other, other_key = create_key(ledger_url, org="acme", principal="agent-b")
        assert cache.lookup(store.engines, secret) == key
        token = cache.start()  # a lookup of `other` under way while `key` is revoked
        revoke_key(ledger_url, key_id=key.key_id)
        cache.put(other, other_key, token)
        assert cache.get(other) is None
        assert cache.lookup(store.engines, secret) is None
        assert cache.lookup(store.engines, other) == other_key
        assert cache.get(other) == other_key
    finally:
        store.close()


def test_cache_bounds_and_bad_arguments() -> None:
    """At most ``max_entries`` keys are kept (the oldest goes); a negative ttl or no room
    is VALIDATION_ERROR."""
    from prefect_baton.rest.keys import ApiKey

    cache = KeyCache(60, max_entries=2, clock=Clock())
    keys = [
        ApiKey(key_id=f"key_{i}", org="o", principal="p", role="agent", scopes=(), created_at_ms=0)
        for i in range(3)
    ]
    for i, k in enumerate(keys):
        cache.put(f"bk_{i}", k, cache.start())
    assert [cache.get(f"bk_{i}") for i in range(3)] == [None, keys[1], keys[2]]
    cache.clear()
    assert cache.get("bk_2") is None
    for bad in ({"ttl_seconds": -1}, {"ttl_seconds": float("nan")}):
        with pytest.raises(errors.ValidationError):
            KeyCache(**bad)  # type: ignore[arg-type]
    with pytest.raises(errors.ValidationError):
        KeyCache(1, max_entries=0)


def test_server_refuses_a_key_revoked_in_its_process_at_once(
    ledger_url: str, org: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a long cache (300 s), the served app still gives 401 right after
    ``revoke_key`` in its process, and writes nothing."""
    monkeypatch.setenv("BATON_KEY_CACHE_SECONDS", "300")
    with TestClient(create_app(ledger_url), raise_server_exceptions=False) as client:
        secret, key = create_key(ledger_url, org=org, principal="agent-a")
        h = {"Authorization": f"Bearer {secret}"}
        assert client.get("/v1/leases", headers=h).status_code == 200
        assert client.app.state.key_cache.get(secret) == key  # type: ignore[attr-defined]
        revoke_key(ledger_url, key_id=key.key_id)
        before = row_counts(ledger_url)
        error(client.post("/v1/leases", json=LEASE, headers=h), 401, "UNAUTHENTICATED")
        assert row_counts(ledger_url) == before


def test_server_without_cache_refuses_a_key_revoked_elsewhere_at_once(
    ledger_url: str, org: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``BATON_KEY_CACHE_SECONDS=0``: a revocation by ``baton keys revoke`` (another
    process) is 401 on the next request; with the cache on it is answered until the
    entry ages out (not waited for here)."""
    monkeypatch.setenv("BATON_KEY_CACHE_SECONDS", "0")
    with TestClient(create_app(ledger_url), raise_server_exceptions=False) as client:
        secret, key = create_key(ledger_url, org=org, principal="agent-a")
        h = {"Authorization": f"Bearer {secret}"}
        assert client.get("/v1/leases", headers=h).status_code == 200
        _revoke_in_another_process(ledger_url, key.key_id)
        error(client.get("/v1/leases", headers=h), 401, "UNAUTHENTICATED")

    monkeypatch.setenv("BATON_KEY_CACHE_SECONDS", "300")
    with TestClient(create_app(ledger_url), raise_server_exceptions=False) as client:
        secret, key = create_key(ledger_url, org=org, principal="agent-b")
        h = {"Authorization": f"Bearer {secret}"}
        assert client.get("/v1/leases", headers=h).status_code == 200
        _revoke_in_another_process(ledger_url, key.key_id)
        assert client.get("/v1/leases", headers=h).status_code == 200
        client.app.state.key_cache.clear()  # type: ignore[attr-defined]
        error(client.get("/v1/leases", headers=h), 401, "UNAUTHENTICATED")


def test_bad_redis_url_is_validation_error(tmp_path: Path) -> None:
    """create_app with a malformed Redis URL is VALIDATION_ERROR,
    not redis-py's ValueError."""
    with pytest.raises(errors.ValidationError, match="bad Redis URL"):
        create_app(f"sqlite:///{tmp_path / 'l.db'}", redis_url="nonsense://x")
