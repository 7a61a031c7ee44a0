"""``baton serve`` and ``baton keys``: a real server process answering a key made by
``baton keys create`` until ``baton keys revoke``; bad input is VALIDATION_ERROR and stores
nothing; neither secrets nor their hashes are listed or logged."""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from prefect_baton.cli import app
from prefect_baton.rest.__main__ import RedactKeys, log_config
from prefect_baton.rest.keys import list_keys

from .conftest import BATON_SCRIPT, CLEAN_ENV, Cli, process_env

LEASE = {"resource_type": "deploy", "resource_id": "checkout", "ttl_seconds": 60}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until_listening(proc: subprocess.Popen[str], port: int) -> None:
    pause = threading.Event()
    for _ in range(3000):
        assert proc.poll() is None, "baton serve exited before listening"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            pause.wait(0.02)
    raise AssertionError("baton serve did not start listening")


@pytest.fixture
def served(cli: Cli) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``baton serve --port P`` on the test's ledger as a real process, stopped by pid."""
    port = _free_port()
    argv = [str(BATON_SCRIPT), "serve", "--port", str(port), "--ledger-url", cli.ledger_url]
    # Key cache off: a `baton keys revoke` (another process) is then refused at once; with
    # the cache on, within BATON_KEY_CACHE_SECONDS (tests/rest/test_server_perf_rules.py).
    env = {**process_env(), "BATON_KEY_CACHE_SECONDS": "0"}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        _wait_until_listening(proc, port)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=60)


def test_serve_answers_a_created_key_until_it_is_revoked(
    cli: Cli, served: tuple[str, subprocess.Popen[str]]
) -> None:
    """A key from `baton keys create` acquires over HTTP; after `baton keys revoke` it is 401;
    the server's log holds neither the secret nor the Authorization header."""
    url, proc = served
    made = cli.ok("keys", "create", "--scope", "leases:read", "--scope", "leases:write")
    secret, key_id = made["secret"], made["key"]["key_id"]
    assert secret.startswith("bk_")
    assert made["key"]["org"] == cli.org
    assert made["key"]["principal"] == "alice"
    h = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/v1/leases", json=LEASE, headers=h)
        assert r.status_code == 201, r.text
        assert r.json()["data"]["owner"] == "alice"
        r = c.get("/v1/events", headers=h)
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "FORBIDDEN"
        revoked = cli.ok("keys", "revoke", key_id)
        assert revoked["key"]["revoked_at"] is not None
        r = c.get("/v1/leases", headers=h)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "UNAUTHENTICATED"
        c.get(f"/v1/leases?api_key={secret}")
    proc.terminate()
    out, _ = proc.communicate(timeout=60)
    assert "/v1/leases" in out
    assert secret not in out
    assert secret[3:] not in out
    assert "Bearer" not in out


def test_keys_create_prints_the_secret_once_with_a_warning(cli: Cli) -> None:
    """Table output shows the secret and warns on stderr; only the hash is stored."""
    run = cli("keys", "create", "--role", "owner", fmt="table")
    assert run.code == 0, run.text
    secret = next(w for w in run.stdout.split() if w.startswith("bk_"))
    assert "not shown again" in run.stderr
    engine = create_engine(cli.ledger_url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM baton_api_keys")).all()
    engine.dispose()
    assert len(rows) == 1
    assert secret not in repr(rows)
    (key,) = list_keys(cli.ledger_url)
    assert (key.org, key.principal, key.role) == (cli.org, "alice", "owner")


def test_keys_list_shows_no_secret_and_marks_revoked(cli: Cli) -> None:
    """List gives id, org, principal, role, scopes, created, revoked; never secret or hash."""
    first = cli.ok("keys", "create", principal="agent-a")
    second = cli.ok("keys", "create", "--scope", "events:read", principal="agent-b")
    cli.ok("keys", "revoke", first["key"]["key_id"])
    listed = cli.ok("keys", "list")
    rows = listed["keys"]
    assert [r["key_id"] for r in rows] == [first["key"]["key_id"], second["key"]["key_id"]]
    assert set(rows[0]) == {
        "key_id",
        "org",
        "principal",
        "role",
        "scopes",
        "created_at",
        "revoked_at",
    }
    assert rows[0]["revoked_at"] is not None
    for stamp in (rows[0]["created_at"], rows[0]["revoked_at"], rows[1]["created_at"]):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp), stamp
    assert rows[1]["revoked_at"] is None
    assert rows[1]["scopes"] == ["events:read"]
    active = cli.ok("keys", "list", "--active-only")["keys"]
    assert [r["key_id"] for r in active] == [second["key"]["key_id"]]
    for run in (cli("keys", "list"), cli("keys", "list", fmt="table")):
        for made in (first, second):
            assert made["secret"] not in run.text
            assert made["secret"][3:] not in run.text
    other_org = Cli(cli.ledger_url, "another-org")
    assert other_org.ok("keys", "list")["keys"] == []


@pytest.mark.parametrize(
    ("args", "principal", "role"),
    [
        (("--scope", "leases:admin"), "alice", "agent"),
        (("--scope", ""), "alice", "agent"),
        ((), "alice", "root"),
        ((), "", "agent"),
        ((), "x" * 300, "agent"),
        ((), "bad\x01name", "agent"),
    ],
    ids=["unknown-scope", "empty-scope", "bad-role", "empty-principal", "long-principal", "ctrl"],
)
def test_keys_create_bad_input_is_validation_error(
    cli: Cli, args: tuple[str, ...], principal: str, role: str
) -> None:
    """A bad scope, role or principal exits 2 with VALIDATION_ERROR and stores no key."""
    run = cli("keys", "create", *args, principal=principal, role=role)
    assert run.code == 2, run.text
    assert run.json["error"]["code"] == "VALIDATION_ERROR"
    assert list_keys(cli.ledger_url, include_revoked=True) == []


def test_keys_create_needs_org_and_principal(sqlite_ledger: str) -> None:
    """Without --org or --principal (and no BATON_ORG/BATON_PRINCIPAL) nothing is created."""
    runner = CliRunner()
    for argv in (
        ["--ledger-url", sqlite_ledger, "--format", "json", "keys", "create", "--org", "acme"],
        ["--ledger-url", sqlite_ledger, "--format", "json", "keys", "create", "--principal", "a"],
    ):
        result = runner.invoke(app, argv, env=CLEAN_ENV)
        assert result.exit_code == 2, result.stdout
        assert '"VALIDATION_ERROR"' in result.stdout
    assert list_keys(sqlite_ledger, include_revoked=True) == []


def test_keys_revoke_unknown_or_bad_id(cli: Cli) -> None:
    """An unknown key id is NOT_FOUND (exit 5); an empty one VALIDATION_ERROR (exit 2)."""
    run = cli("keys", "revoke", "key_nope")
    assert (run.code, run.json["error"]["code"]) == (5, "NOT_FOUND")
    run = cli("keys", "revoke", "")
    assert (run.code, run.json["error"]["code"]) == (2, "VALIDATION_ERROR")


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_serve_bad_port_is_validation_error(cli: Cli, port: str) -> None:
    """A port outside 1..65535 or not a number exits 2 before anything is served."""
    run = cli("serve", "--port", port)
    assert run.code == 2, run.text
    assert run.json["error"]["code"] == "VALIDATION_ERROR"


@pytest.mark.parametrize("host", ["not a host!", "256.1.1.1"])
def test_serve_bad_host_is_validation_error_like_mcp(cli: Cli, host: str) -> None:
    """A --host that is no host name or IP address exits 2 before any lookup, with the
    same VALIDATION_ERROR message as ``baton mcp --transport http``."""
    port = str(_free_port())
    served = cli("serve", "--host", host, "--port", port)
    mcp = cli("mcp", "--transport", "http", "--host", host, "--port", port)
    assert (served.code, mcp.code) == (2, 2), served.text
    assert served.json["error"]["code"] == "VALIDATION_ERROR"
    assert "--host" in served.json["error"]["message"]
    assert served.json["error"]["message"] == mcp.json["error"]["message"]


def test_serve_bad_ledger_url_is_validation_error(cli: Cli) -> None:
    """An unusable ledger URL exits 2 with VALIDATION_ERROR."""
    bad = Cli("mysql://nowhere/db", cli.org)
    run = bad("serve", "--port", str(_free_port()))
    assert run.code == 2, run.text
    assert run.json["error"]["code"] == "VALIDATION_ERROR"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_a_taken_port_is_unavailable(cli: Cli, workers: str) -> None:
    """A port another socket listens on exits 11 with UNAVAILABLE (a real process), with
    one worker and with several (the address is bound before the process is replaced by
    the lean supervisor)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = cli.proc("serve", "--port", str(port), "--workers", workers)
    assert run.code == 11, run.text
    assert run.json["error"]["code"] == "UNAVAILABLE"


def test_log_filter_redacts_keys(caplog: pytest.LogCaptureFixture) -> None:
    """RedactKeys removes bk_ keys and Bearer tokens from messages and arguments, and
    every handler of the served log configuration carries it."""
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:1", "GET", "/v1/leases?k=bk_SECRETsecret-_1&a=Bearer%20tok", "1.1", 401),
        None,
    )
    assert RedactKeys().filter(record)
    message = record.getMessage()
    assert "bk_SECRET" not in message
    assert "tok" not in message
    assert message.endswith('"GET /v1/leases?k=[redacted]&a=[redacted] HTTP/1.1" 401')
    cfg = log_config()
    assert cfg["handlers"]
    assert all("redact_keys" in h["filters"] for h in cfg["handlers"].values())


KEY_TAIL = "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0u-_"


@pytest.mark.parametrize(
    "encoded",
    [
        "bk%5F" + KEY_TAIL,
        "bk%255F" + KEY_TAIL,
        "bk%25255F" + KEY_TAIL,
        "%62k%255f" + KEY_TAIL,
        "bk%" + "25" * 20 + "5F" + KEY_TAIL,
    ],
    ids=["once", "twice", "thrice", "mixed", "twenty-one"],
)
def test_log_filter_redacts_a_key_percent_encoded_at_any_depth(encoded: str) -> None:
    """A key in the URL's path or query is redacted however many times it was
    percent-encoded (before: ``bk%255F...``, encoded twice, was logged as sent); a token
    still changing after the filter's rounds of decoding is redacted unread. A token
    without a key keeps its encoding."""
    path = f"/v1/leases/{encoded}?x={encoded}&q=a%2520b"
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:1", "GET", path, "1.1", 404),
        None,
    )
    assert RedactKeys().filter(record)
    message = record.getMessage()
    assert KEY_TAIL not in message
    assert message.endswith('"GET /v1/leases/[redacted]?x=[redacted]&q=a%2520b HTTP/1.1" 404')


def test_keys_revoke_help_names_the_servers_key_cache(cli: Cli) -> None:
    """The help does not promise an immediate 401: it names the key cache of a running
    server and its default, the value the server uses (BatonSettings)."""
    from prefect_baton._settings import BatonSettings

    default = BatonSettings.model_fields["key_cache_seconds"].default
    shown = " ".join(cli("keys", "revoke", "--help").stdout.split())
    assert f"at the latest BATON_KEY_CACHE_SECONDS (default {default:g} s" in shown
    assert "at once" not in shown


@pytest.mark.parametrize(
    "argv",
    [
        ("keys", "list"),
        ("keys", "revoke", "key_x"),
        ("db", "current"),
        ("db", "upgrade"),
        ("audit",),
        ("serve", "--port", "9"),
        ("ui", "--port", "9"),
        ("reconcile", "--redis-url", "redis://127.0.0.1:9/0"),
        ("reconcile", "--return-to-ledger", "--redis-url", "redis://127.0.0.1:9/0"),
        ("mcp", "--transport", "http", "--port", "9"),
    ],
)
def test_ledger_commands_refuse_the_rest_api_without_a_ledger_url(
    argv: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With BATON_API_URL set (the CLI talking to a server), the commands that act on a
    ledger directly (keys, db, audit, serve, ui, reconcile, mcp over HTTP) are VALIDATION_ERROR
    (exit 2) unless a ledger URL is given, and create no ./.baton/ledger.db; with
    --ledger-url or BATON_LEDGER_URL they run on that ledger."""
    monkeypatch.chdir(tmp_path)
    env = {**CLEAN_ENV, "BATON_API_URL": "http://127.0.0.1:9", "BATON_API_KEY": "bk_x"}
    runner = CliRunner()
    run = runner.invoke(app, ["--format", "json", *argv], env=env)
    assert run.exit_code == 2, run.stdout
    error = json.loads(run.stdout)["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert "acts on the ledger directly" in error["message"]
    assert "--ledger-url" in error["message"]
    assert list(tmp_path.iterdir()) == []
    ledger = f"sqlite:///{tmp_path / 'given.db'}"
    given = runner.invoke(
        app, ["--ledger-url", ledger, "--format", "json", "db", "upgrade"], env=env
    )
    assert given.exit_code == 0, given.stdout
    by_env = runner.invoke(
        app, ["--format", "json", "keys", "list"], env={**env, "BATON_LEDGER_URL": ledger}
    )
    assert by_env.exit_code == 0, by_env.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["given.db"]


def test_audit_runs_on_baton_ledger_url_beside_the_rest_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``baton audit`` reads the ledger itself (there is no audit over the REST API): with
    BATON_API_URL and BATON_API_KEY set, BATON_LEDGER_URL is the ledger it audits, as for
    ``baton keys`` and ``baton db``."""
    monkeypatch.chdir(tmp_path)
    ledger = f"sqlite:///{tmp_path / 'given.db'}"
    env = {
        **CLEAN_ENV,
        "BATON_API_URL": "http://127.0.0.1:9",
        "BATON_API_KEY": "bk_x",
        "BATON_LEDGER_URL": ledger,
        "BATON_ORG": "acme",
    }
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"], env=env).exit_code == 0
    run = runner.invoke(app, ["--format", "json", "audit"], env=env)
    assert run.exit_code == 0, run.stdout
    assert json.loads(run.stdout)["audit"]["org"] == "acme"


def test_root_help_names_the_rest_api_variables() -> None:
    """``baton --help`` lists BATON_API_URL and BATON_API_KEY beside the other variables."""
    shown = CliRunner().invoke(app, ["--help"], env=CLEAN_ENV).stdout
    assert "BATON_API_URL" in shown
    assert "BATON_API_KEY" in shown
