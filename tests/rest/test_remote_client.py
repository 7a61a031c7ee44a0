"""``Baton(api_url=..., api_key=...)``: the REST backend's identity rules, error mapping and
bad input. Against the session's served API (real HTTP, ``rest_api`` of tests/conftest.py)
where a server is needed; status mapping of answers the app never gives (a bare 503, an
HTML page, a timeout) through httpx's mock transport."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefect_baton import (
    AsyncBaton,
    Baton,
    BatonError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    UnavailableError,
    ValidationError,
    VersionConflictError,
)
from prefect_baton._settings import BatonSettings
from prefect_baton._stores.rest.client import RestStore
from prefect_baton.errors import LeaseLostError, UnauthenticatedError
from prefect_baton.rest import create_key, revoke_key

from .conftest import row_counts

MakeSecret = Callable[..., str]


@pytest.fixture
def secret(sqlite_url: str, org: str) -> MakeSecret:
    """Create a key on the served API's ledger; returns its secret."""

    def make(
        principal: str = "agent-a", role: str = "agent", scopes: list[str] | None = None
    ) -> str:
        return create_key(sqlite_url, org=org, principal=principal, role=role, scopes=scopes)[0]

    return make


@pytest.fixture
def remote(rest_api: str, secret: MakeSecret) -> Iterator[Baton]:
    """A REST client for (org, agent-a, agent)."""
    b = Baton(api_url=rest_api, api_key=secret())
    yield b
    b.close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mock(handler: Callable[[httpx.Request], httpx.Response]) -> RestStore:
    client = httpx.Client(base_url="http://api.test", transport=httpx.MockTransport(handler))
    return RestStore("http://api.test", "bk_test", client=client)


# ------------------------------------------------------------------------------ identity


def test_identity_comes_from_the_key(remote: Baton, org: str) -> None:
    """The client's org, principal and role are the key's (GET /v1/me)."""
    assert (remote.org, remote.principal, remote.role) == (org, "agent-a", "agent")
    lease = remote.leases.acquire("file", "a.py", ttl_seconds=30)
    assert lease.owner == "agent-a"


def test_me_route_names_the_key(rest_api: str, secret: MakeSecret, org: str) -> None:
    """GET /v1/me answers the key's org, principal, role and scopes."""
    key = secret("boss", "owner", ["leases:read"])
    resp = httpx.get(f"{rest_api}/v1/me", headers={"Authorization": f"Bearer {key}"})
    assert resp.status_code == 200
    data = resp.json()["data"]
    assert (data["org"], data["principal"], data["role"]) == (org, "boss", "owner")
    assert data["scopes"] == ["leases:read"]


def test_explicit_identity_must_match_the_key(rest_api: str, secret: MakeSecret, org: str) -> None:
    """An org, principal or role that differs from the key's is FORBIDDEN; equal is fine."""
    key = secret()
    for kwargs in ({"principal": "agent-b"}, {"org": "other-org"}, {"role": "admin"}):
        with pytest.raises(ForbiddenError):
            Baton(api_url=rest_api, api_key=key, **kwargs)
    same = Baton(org=org, principal="agent-a", role="agent", api_url=rest_api, api_key=key)
    assert same.principal == "agent-a"
    same.close()


def test_remote_client_cannot_mint_identities(remote: Baton) -> None:
    """as_principal is FORBIDDEN on a REST client (after validating its arguments); so
    are prune_receipts and the ledger store."""
    with pytest.raises(ValidationError):
        remote.as_principal("")
    with pytest.raises(ForbiddenError):
        remote.as_principal("agent-b")
    with pytest.raises(ForbiddenError):
        AsyncBaton(sync=remote).as_principal("agent-b")
    with pytest.raises(ForbiddenError):
        remote.prune_receipts()
    with pytest.raises(ForbiddenError):
        _ = remote.store


def test_environment_selects_the_rest_api(
    rest_api: str, secret: MakeSecret, monkeypatch: pytest.MonkeyPatch, org: str
) -> None:
    """BATON_API_URL and BATON_API_KEY make Baton() a REST client; an explicit ledger wins."""
    monkeypatch.setenv("BATON_API_URL", rest_api)
    monkeypatch.setenv("BATON_API_KEY", secret("agent-env"))
    b = Baton()
    assert (b.org, b.principal) == (org, "agent-env")
    assert isinstance(b.authority, RestStore)
    b.close()
    monkeypatch.delenv("BATON_API_KEY")
    with pytest.raises(ValidationError, match="api_key"):
        Baton()


def test_cli_and_python_pick_the_same_store_from_one_environment(
    rest_api: str,
    secret: MakeSecret,
    monkeypatch: pytest.MonkeyPatch,
    org: str,
    tmp_path: Path,
) -> None:
    """With BATON_API_URL, BATON_API_KEY and also BATON_LEDGER_URL (another ledger) in the
    environment, ``baton`` runs through the REST API as ``Baton()`` does: both see one
    lease, never one holder on each store; only the --ledger-url flag picks a ledger."""
    from typer.testing import CliRunner

    from prefect_baton.cli import app

    other = tmp_path / "other.db"
    env = {
        "BATON_API_URL": rest_api,
        "BATON_API_KEY": secret("agent-env"),
        "BATON_LEDGER_URL": f"sqlite:///{other}",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    runner = CliRunner()
    argv = ["--format", "json", "lease", "acquire", "deploy", "shared", "--ttl-seconds", "60"]
    first = runner.invoke(app, argv)
    assert first.exit_code == 0, first.stdout
    assert json.loads(first.stdout)["lease"]["owner"] == "agent-env"
    with Baton() as b:
        assert isinstance(b.authority, RestStore)
        assert (b.org, b.principal) == (org, "agent-env")
        assert b.leases.inspect("deploy", "shared").held
    rival = Baton(api_url=rest_api, api_key=secret("agent-other"))
    with rival, pytest.raises(ConflictError):
        rival.leases.acquire("deploy", "shared", ttl_seconds=60)
    assert not other.exists()
    local = runner.invoke(app, ["--ledger-url", f"sqlite:///{other}", "--principal", "ops", *argv])
    assert local.exit_code == 0, local.stdout
    assert json.loads(local.stdout)["lease"]["owner"] == "ops"
    assert other.exists()


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "url",
    ["", "   ", "not a url", "ftp://127.0.0.1/", "http://", "http://127.0.0.1:8787/?x=1", 42],
)
def test_bad_api_url_is_validation_error(url: Any) -> None:
    """A malformed or non-http(s) api_url is VALIDATION_ERROR before any request."""
    with pytest.raises(ValidationError):
        Baton(api_url=url, api_key="bk_whatever")


def test_api_url_that_is_not_the_api_is_validation_error(rest_api: str, secret: MakeSecret) -> None:
    """A reachable URL that does not serve /v1/me (a wrong prefix) is VALIDATION_ERROR."""
    with pytest.raises(ValidationError, match="does not serve"):
        Baton(api_url=rest_api + "/api", api_key=secret())


@pytest.mark.parametrize("key", ["", "bk_ with space", "bk_\nnewline", "bk_é", None, 7])
def test_bad_api_key_is_validation_error_without_echo(rest_api: str, key: Any) -> None:
    """A key that cannot be a bearer token is VALIDATION_ERROR and is not echoed."""
    with pytest.raises(ValidationError) as ei:
        RestStore(rest_api, key)
    if isinstance(key, str) and key:
        assert key not in str(ei.value)


def test_api_url_with_a_ledger_is_validation_error(rest_api: str, sqlite_url: str) -> None:
    """api_url together with ledger_url (or redis_url) is VALIDATION_ERROR; api_key
    without api_url too."""
    with pytest.raises(ValidationError):
        Baton(ledger_url=sqlite_url, api_url=rest_api, api_key="bk_x")
    with pytest.raises(ValidationError):
        Baton(redis_url="redis://127.0.0.1:6379/0", api_url=rest_api, api_key="bk_x")
    with pytest.raises(ValidationError):
        Baton(ledger_url=sqlite_url, api_key="bk_x")


def test_bad_input_writes_nothing(remote: Baton, sqlite_url: str) -> None:
    """Input the client refuses (bad TTL, non-JSON state, bad fence) never reaches the
    ledger: VALIDATION_ERROR and no row."""
    before = row_counts(sqlite_url)
    with pytest.raises(ValidationError):
        remote.leases.acquire("file", "a.py", ttl_seconds=5)
    with pytest.raises(ValidationError):
        remote.checkpoints.save("s", "k", {"x": float("nan")})
    with pytest.raises(ValidationError):
        remote.checkpoints.save("s", "k", {"n": 1}, fence="lease_x")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        remote.leases.acquire_many([("file", "a"), ("file", "a")], ttl_seconds=30)
    assert row_counts(sqlite_url) == before


# ------------------------------------------------------------------------------ error mapping


def test_server_down_is_unavailable() -> None:
    """No server listening: UNAVAILABLE (a connection failure), not a raw httpx error."""
    with pytest.raises(UnavailableError):
        Baton(api_url=f"http://127.0.0.1:{_free_port()}", api_key="bk_nobody")


def test_unknown_or_revoked_key_is_unauthenticated(
    rest_api: str, sqlite_url: str, org: str
) -> None:
    """An unknown key, and a key revoked while a client uses it, are UNAUTHENTICATED."""
    with pytest.raises(UnauthenticatedError) as ei:
        Baton(api_url=rest_api, api_key="bk_unknown")
    assert ei.value.code == "UNAUTHENTICATED"
    secret, key = create_key(sqlite_url, org=org, principal="agent-a")
    b = Baton(api_url=rest_api, api_key=secret)
    revoke_key(sqlite_url, key_id=key.key_id)
    with pytest.raises(UnauthenticatedError):
        b.leases.acquire("file", "a.py", ttl_seconds=30)
    b.close()


@pytest.mark.slow
def test_key_revoked_inside_a_lease_block_ends_it_as_lease_lost(
    rest_api: str, sqlite_url: str, org: str
) -> None:
    """Revoking the key while a remote lease block runs: renewals are refused, the handle
    turns lost once the TTL has passed, and leaving the block raises LEASE_LOST (what a
    lost lease always raises), not the clean-up release's UNAUTHENTICATED."""
    secret, key = create_key(sqlite_url, org=org, principal="agent-a")
    b = Baton(api_url=rest_api, api_key=secret)
    with (  # noqa: PT012
        pytest.raises(LeaseLostError),
        b.lease("file", "revoked.py", ttl_seconds=10, renew_every_seconds=1.0) as held,
    ):
        revoke_key(sqlite_url, key_id=key.key_id)
        deadline = time.monotonic() + 25
        while not held.lost and time.monotonic() < deadline:
            time.sleep(0.2)
        assert held.lost
    b.close()


def test_missing_scope_is_forbidden(rest_api: str, secret: MakeSecret) -> None:
    """A key without the route's scope gets FORBIDDEN; it can still read."""
    b = Baton(api_url=rest_api, api_key=secret(scopes=["leases:read"]))
    assert not b.leases.inspect("file", "a.py").held
    with pytest.raises(ForbiddenError):
        b.leases.acquire("file", "a.py", ttl_seconds=30)
    b.close()


def test_conflict_and_version_conflict_keep_their_fields(
    remote: Baton, rest_api: str, secret: MakeSecret
) -> None:
    """A lease CONFLICT carries expires_at; VERSION_CONFLICT the current and expected
    versions, as on the local client."""
    lease = remote.leases.acquire("file", "a.py", ttl_seconds=30)
    other = Baton(api_url=rest_api, api_key=secret("agent-b"))
    with pytest.raises(ConflictError) as ce:
        other.leases.acquire("file", "a.py", ttl_seconds=30)
    assert ce.value.expires_at == lease.expires_at
    assert "agent-a" not in ce.value.message
    with pytest.raises(VersionConflictError) as ve:
        remote.leases.renew(lease, expected_version=7)
    assert (ve.value.current_version, ve.value.expected_version) == (lease.version, 7)
    with pytest.raises(NotFoundError):
        other.leases.get(lease.lease_id)
    other.close()


def test_idempotency_key_travels_and_replays(remote: Baton) -> None:
    """idempotency_key goes as the Idempotency-Key header; meta.replayed comes back as
    the model's replayed."""
    first = remote.checkpoints.save("s", "k", {"n": 1}, idempotency_key="save-1")
    again = remote.checkpoints.save("s", "k", {"n": 1}, idempotency_key="save-1")
    assert (first.replayed, again.replayed) == (False, True)
    assert again.checkpoint_id == first.checkpoint_id


def test_non_ascii_idempotency_key_replays(remote: Baton, sqlite_url: str, org: str) -> None:
    """A key outside ASCII travels as UTF-8 and is the same key as in Python: a local
    client's retry with it replays the REST client's acquire."""
    lease = remote.leases.acquire("file", "a.py", ttl_seconds=30, idempotency_key="clé-1")
    local = Baton(ledger_url=sqlite_url, org=org, principal="agent-a")
    again = local.leases.acquire("file", "a.py", ttl_seconds=30, idempotency_key="clé-1")
    assert again.replayed
    assert again.lease_id == lease.lease_id
    local.close()


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (503, b"", UnavailableError),
        (502, b"<html>bad gateway</html>", UnavailableError),
        (500, b'{"error": {"code": "INTERNAL", "message": "internal error"}}', UnavailableError),
        (401, b"", UnauthenticatedError),
        (403, b"<html>no</html>", ForbiddenError),
        (413, b'{"error": {"code": "PAYLOAD_TOO_LARGE", "message": "big"}}', ValidationError),
        (409, b'{"error": {"code": "STALE_FENCE", "message": "stale"}}', BatonError),
        (418, b"teapot", BatonError),
    ],
)
def test_status_mapping(status: int, body: bytes, error: type[BatonError]) -> None:
    """Answers without (or with) an error envelope map to the matching coded error."""
    backend = _mock(lambda _r: httpx.Response(status, content=body))
    with pytest.raises(error):
        backend.identity()


def test_stale_fence_envelope_maps_to_its_class() -> None:
    """An error envelope's code picks the error class (STALE_FENCE, UNAVAILABLE, ...)."""
    from prefect_baton import StaleFenceError

    backend = _mock(
        lambda _r: httpx.Response(409, json={"error": {"code": "STALE_FENCE", "message": "x"}})
    )
    with pytest.raises(StaleFenceError):
        backend.identity()


def test_timeout_is_unavailable() -> None:
    """A request that times out is UNAVAILABLE."""

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(UnavailableError, match="did not answer"):
        _mock(handler).identity()


def test_bad_timeout_setting_is_validation_error() -> None:
    """A non-positive request timeout is refused (RestStore and BATON_API_TIMEOUT_SECONDS)."""
    with pytest.raises(ValidationError):
        RestStore("http://127.0.0.1:1", "bk_x", timeout_seconds=0)
    with pytest.raises(Exception, match="api_timeout_seconds"):
        BatonSettings(api_timeout_seconds=-1)


# ------------------------------------------------------------------- the key stays secret


def test_key_never_in_logs_reprs_or_errors(
    rest_api: str, sqlite_url: str, org: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The API key shows in no log line (httpx/httpcore at DEBUG), repr or error message."""
    secret, key = create_key(sqlite_url, org=org, principal="agent-a")
    caplog.set_level(logging.DEBUG)
    b = Baton(api_url=rest_api, api_key=secret)
    lease = b.leases.acquire("file", "a.py", ttl_seconds=30)
    messages = []
    for call in (
        lambda: b.leases.acquire("file", "a.py", ttl_seconds=5),
        lambda: b.leases.get("lease_" + "0" * 32),
        lambda: b.as_principal("agent-b"),
    ):
        with pytest.raises(BatonError) as ei:
            call()
        messages.append(str(ei.value))
    b.leases.release(lease)
    revoke_key(sqlite_url, key_id=key.key_id)
    with pytest.raises(UnauthenticatedError) as ei2:
        b.leases.inspect("file", "a.py")
    messages.append(str(ei2.value))
    texts = [caplog.text, repr(b), repr(b.authority), repr(b.settings), *messages]
    settings = BatonSettings(api_url=rest_api, api_key=secret)
    texts += [repr(settings), str(settings.model_dump())]
    assert caplog.text  # httpx did log the requests
    for text in texts:
        assert secret not in text
    b.close()
