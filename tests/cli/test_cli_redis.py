"""The command line with ``--redis-url``: leases live on the Redis fast path."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefect_baton import Baton
from prefect_baton.cli import app

from ..conftest import REDIS_URL, require_redis


def _run(*args: str) -> tuple[int, dict[str, object]]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, json.loads(res.stdout)


def test_redis_url_option_puts_leases_on_redis(tmp_path: Path) -> None:
    """With --redis-url a lease acquired on the command line conflicts with a Redis-backed
    client and is released through Redis."""
    require_redis()
    ledger = f"sqlite:///{tmp_path / 'l.db'}"
    org = f"cli-{uuid.uuid4().hex[:8]}"
    base = ["--ledger-url", ledger, "--redis-url", REDIS_URL, "--org", org, "--format", "json"]
    code, out = _run(
        *base,
        "--principal",
        "a",
        "lease",
        "acquire",
        "deploy",
        "svc",
        "--ttl-seconds",
        "30",
        "--idempotency-key",
        "run-1",
    )
    assert code == 0, out
    lease = out["lease"]
    assert isinstance(lease, dict)
    other = Baton(ledger_url=ledger, org=org, principal="b", redis_url=REDIS_URL, ack="ledger")
    assert other.leases.inspect("deploy", "svc").held
    code, out = _run(
        *base, "--principal", "b", "lease", "acquire", "deploy", "svc", "--ttl-seconds", "30"
    )
    assert code == 3
    code, out = _run(
        *base,
        "--principal",
        "a",
        "lease",
        "release",
        "--lease-id",
        str(lease["lease_id"]),
        "--execution-key",
        "run-1",
    )
    assert code == 0, out
    assert not other.leases.inspect("deploy", "svc").held
    other.close()


def test_a_redis_database_the_server_lacks_is_validation_error(tmp_path: Path) -> None:
    """``--redis-url redis://...:6379/99`` (a database index the server does not have) is
    a configuration error: VALIDATION_ERROR (exit 2) at once, not retried as UNAVAILABLE."""
    require_redis()
    ledger = f"sqlite:///{tmp_path / 'l.db'}"
    url = REDIS_URL.rsplit("/", 1)[0] + "/99"
    code, out = _run(
        *["--ledger-url", ledger, "--redis-url", url, "--org", "o", "--format", "json"],
        *["--principal", "a", "lease", "acquire", "deploy", "svc", "--ttl-seconds", "30"],
    )
    error = out["error"]
    assert isinstance(error, dict)
    assert (code, error["code"]) == (2, "VALIDATION_ERROR"), out
    assert "DB index is out of range" in str(error["message"])


@pytest.mark.parametrize(
    ("tail", "part"),
    [
        ("/abc", "the path '/abc' is not a database index"),
        ("/10/x", "the path '/10/x' has more than one segment"),
        ("/10?db=3", "the path names database 10 and the query db=3"),
    ],
)
def test_a_bad_redis_database_part_is_validation_error(
    tmp_path: Path, tail: str, part: str
) -> None:
    """``--redis-url redis://...:<port>/abc`` (or ``/10/x``, or ``/10?db=3``) exits 2 with
    VALIDATION_ERROR naming the URL part, instead of holding leases in database 0 (the port
    has no server: nothing is connected to, with or without the check, and no password is
    shown)."""
    ledger = f"sqlite:///{tmp_path / 'l.db'}"
    url = f"redis://:pw-secret@127.0.0.1:18199{tail}"
    code, out = _run(
        *["--ledger-url", ledger, "--redis-url", url, "--org", "o", "--format", "json"],
        *["--principal", "a", "lease", "acquire", "deploy", "svc", "--ttl-seconds", "30"],
    )
    error = out["error"]
    assert isinstance(error, dict)
    assert (code, error["code"]) == (2, "VALIDATION_ERROR"), out
    assert f"bad Redis URL: {part}" in str(error["message"])
    assert "pw-secret" not in json.dumps(out)


def _invoke(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_a_client_without_redis_url_is_refused_until_the_org_is_returned(tmp_path: Path) -> None:
    """Once a command with --redis-url used an org, one without it is refused
    (FORBIDDEN, exit 6, naming the remedy) instead of granting on the ledger's copy;
    ``baton reconcile --return-to-ledger`` hands the org back (the lease Redis granted is
    held on the ledger too), and refuses --follow with it (exit 2), --force without it
    (exit 2) and a hand-back through another Redis than the org's (exit 6)."""
    require_redis()
    ledger = f"sqlite:///{tmp_path / 'l.db'}"
    org = f"cli-{uuid.uuid4().hex[:8]}"
    base = ["--ledger-url", ledger, "--org", org, "--format", "json"]
    redis = [*base, "--redis-url", REDIS_URL]
    acquire = ["lease", "acquire", "deploy", "svc", "--ttl-seconds", "30"]
    code, out, _err = _invoke(*redis, "--principal", "a", *acquire)
    assert code == 0, out
    code, out, _err = _invoke(
        *base, "--principal", "b", "lease", "acquire", "deploy", "other", "--ttl-seconds", "30"
    )
    assert code == 6, out
    error = json.loads(out)["error"]
    assert error["code"] == "FORBIDDEN"
    assert "decided by Redis" in error["message"]
    assert "--return-to-ledger" in error["message"]
    code, out, _err = _invoke(*redis, "reconcile", "--return-to-ledger", "--follow")
    assert code == 2, out
    code, out, _err = _invoke(*redis, "reconcile", "--force")
    assert code == 2, out
    assert "--force goes with --return-to-ledger" in json.loads(out)["error"]["message"]
    base_url, _, db = REDIS_URL.rpartition("/")
    other = [*base, "--redis-url", f"{base_url}/{(int(db or 0) + 1) % 16}"]
    code, out, _err = _invoke(*other, "reconcile", "--return-to-ledger")
    assert code == 6, out  # through another Redis than the org's: FORBIDDEN, names --force
    assert "--force" in json.loads(out)["error"]["message"]
    code, out, _err = _invoke(*redis, "reconcile", "--return-to-ledger")
    assert code == 0, out
    assert json.loads(out)["reconcile"] == {"org": org, "returned": True}
    code, _out, err = _invoke(*base, "--principal", "b", *acquire)
    assert code == 3, err  # CONFLICT: the lease Redis granted is on the ledger
    code, out, _err = _invoke(
        *base, "--principal", "b", "lease", "acquire", "deploy", "other", "--ttl-seconds", "30"
    )
    assert code == 0, out
