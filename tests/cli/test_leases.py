"""``baton lease ...`` through Typer's runner: success paths and every lease error code."""

from __future__ import annotations

from typing import Any

import pytest

from prefect_baton import IdempotencyInFlightError
from prefect_baton._client.sync import LeaseAPI

from .conftest import Cli


def acquire(cli: Cli, rid: str = "svc", key: str = "run-1", **kw: Any) -> dict[str, Any]:
    receipt = cli.ok(
        "lease", "acquire", "deploy", rid, "--ttl-seconds", "60", "--execution-key", key, **kw
    )
    lease: dict[str, Any] = receipt["lease"]
    return lease


def test_acquire_prints_a_json_receipt_with_the_lease(cli: Cli) -> None:
    """A JSON acquire is an ok receipt carrying the lease with version, epoch and expiry."""
    receipt = cli.ok(
        "lease",
        "acquire",
        "deploy",
        "svc",
        "--ttl-seconds",
        "60",
        "--idempotency-key",
        "run-1",
        "--purpose",
        "ship",
        "--scope",
        "src/**",
        "--scope",
        "docs/*",
    )
    assert receipt["action"] == "lease.acquire"
    assert receipt["status"] == "ok"
    lease = receipt["lease"]
    assert lease["lease_id"].startswith("lease_")
    assert (lease["owner"], lease["execution_key"]) == ("alice", "run-1")
    assert (lease["version"], lease["epoch"], lease["status"]) == (1, 1, "active")
    assert sorted(lease["scopes"]) == ["docs/*", "src/**"]
    assert lease["ttl_seconds"] == 60
    assert lease["expires_at"] > lease["acquired_at"]


def test_acquire_in_table_mode_prints_a_table(cli: Cli) -> None:
    """Table mode shows the lease fields for humans."""
    run = cli("lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", fmt="table")
    assert run.code == 0, run.text
    assert "lease.acquire" in run.stdout
    assert "lease_" in run.stdout
    assert "epoch" in run.stdout


def test_acquire_retry_with_the_same_key_is_replayed(cli: Cli) -> None:
    """The same execution key and request gives status 'replayed' and the same lease."""
    first = acquire(cli)
    again = cli.ok(
        "lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", "--idempotency-key", "run-1"
    )
    assert again["status"] == "replayed"
    assert again["lease"]["lease_id"] == first["lease_id"]


def test_inspect_shows_the_holder_its_lease_and_others_only_the_expiry(cli: Cli) -> None:
    """Inspect by the holder includes the lease; by another principal only held/expiry."""
    lease = acquire(cli)
    mine = cli.ok("lease", "inspect", "deploy", "svc")["info"]
    assert mine["held"] is True
    assert mine["lease"]["lease_id"] == lease["lease_id"]
    theirs = cli.ok("lease", "inspect", "deploy", "svc", principal="bob")["info"]
    assert theirs["held"] is True
    assert theirs["lease"] is None
    assert theirs["expires_at"] == lease["expires_at"]


def test_inspect_of_a_never_leased_resource_is_version_zero(cli: Cli) -> None:
    """A resource never leased inspects as not held at version 0."""
    info = cli.ok("lease", "inspect", "deploy", "nothing")["info"]
    assert (info["held"], info["version"], info["epoch"]) == (False, 0, 0)


def test_renew_bumps_the_version_and_keeps_id_and_epoch(cli: Cli) -> None:
    """Renew by --lease-id/--execution-key: version +1, same id and epoch."""
    lease = acquire(cli)
    renewed = cli.ok(
        "lease",
        "renew",
        "--lease-id",
        lease["lease_id"],
        "--execution-key",
        "run-1",
        "--ttl-seconds",
        "120",
        "--expected-version",
        "1",
    )["lease"]
    assert renewed["lease_id"] == lease["lease_id"]
    assert (renewed["version"], renewed["epoch"], renewed["ttl_seconds"]) == (2, 1, 120)


def test_transfer_hands_the_lease_to_another_principal(cli: Cli) -> None:
    """Transfer gives a new lease id to the receiver with version and epoch +1."""
    lease = acquire(cli)
    moved = cli.ok(
        "lease",
        "transfer",
        "--lease-id",
        lease["lease_id"],
        "--execution-key",
        "run-1",
        "--to-principal",
        "bob",
        "--new-execution-key",
        "run-2",
        "--ttl-seconds",
        "60",
    )["lease"]
    assert moved["lease_id"] != lease["lease_id"]
    assert (moved["owner"], moved["execution_key"]) == ("bob", "run-2")
    assert (moved["version"], moved["epoch"]) == (2, 2)
    renewed = cli.ok(
        "lease",
        "renew",
        "--lease-id",
        moved["lease_id"],
        "--execution-key",
        "run-2",
        principal="bob",
    )["lease"]
    assert renewed["version"] == 3


def test_transfer_accepts_the_seed_flag_names(cli: Cli) -> None:
    """--new-owner and --new-idempotency-key are aliases (seed 004 task-lease style)."""
    lease = acquire(cli)
    moved = cli.ok(
        "lease",
        "transfer",
        "--lease-id",
        lease["lease_id"],
        "--execution-key",
        "run-1",
        "--new-owner",
        "bob",
        "--new-idempotency-key",
        "run-2",
        "--ttl-seconds",
        "60",
    )["lease"]
    assert moved["owner"] == "bob"


def test_release_then_release_again_is_no_change(cli: Cli) -> None:
    """Release returns a 'released' receipt; repeating it is a 'no_change' receipt, exit 0."""
    lease = acquire(cli)
    args = ("lease", "release", "--lease-id", lease["lease_id"], "--execution-key", "run-1")
    first = cli.ok(*args)
    assert first["status"] == "ok"
    assert first["receipt"]["status"] == "released"
    assert first["receipt"]["lease"]["status"] == "released"
    second = cli.ok(*args)
    assert second["status"] == "no_change"
    assert second["receipt"]["status"] == "no_change"
    assert cli.ok("lease", "inspect", "deploy", "svc")["info"]["held"] is False


def test_force_release_by_an_admin_frees_the_resource(cli: Cli) -> None:
    """An admin force-releases someone's lease; the resource is then free."""
    lease = acquire(cli)
    receipt = cli.ok("lease", "force-release", lease["lease_id"], principal="root", role="admin")
    assert receipt["receipt"]["status"] == "released"
    acquire(cli, key="run-2")


def test_list_shows_your_effective_leases(cli: Cli) -> None:
    """List shows the caller's effective leases; --all adds ended ones (owner '*' for admin)."""
    a = acquire(cli, "a")
    b = acquire(cli, "b", key="run-b")
    cli.ok("lease", "release", "--lease-id", b["lease_id"], "--execution-key", "run-b")
    acquire(cli, "c", key="run-c", principal="bob")
    mine = cli.ok("lease", "list")["leases"]
    assert [x["lease_id"] for x in mine] == [a["lease_id"]]
    everything = cli.ok("lease", "list", "--owner", "*", "--all", role="admin")["leases"]
    assert len(everything) == 3
    table = cli("lease", "list", fmt="table")
    assert table.code == 0
    assert a["lease_id"] in table.stdout


def test_list_of_an_empty_org_in_table_mode_says_none(cli: Cli) -> None:
    """An empty list prints a readable line naming the org it looked in."""
    run = cli("lease", "list", fmt="table")
    assert run.code == 0
    assert f"lease.list: no leases in org '{cli.org}'" in run.stdout


# ----------------------------------------------------------------------------- errors


def test_conflict_exits_3_with_only_the_expiry(cli: Cli) -> None:
    """Another principal's acquire exits 3; the error gives the expiry, never the holder."""
    lease = acquire(cli)
    run = cli(
        "lease",
        "acquire",
        "deploy",
        "svc",
        "--ttl-seconds",
        "60",
        "--purpose",
        "mine",
        principal="bob",
    )
    assert run.code == 3
    receipt = run.json
    assert receipt["ok"] is False
    assert receipt["action"] == "lease.acquire"
    assert receipt["error"]["code"] == "CONFLICT"
    assert receipt["error"]["expires_at"].startswith(lease["expires_at"][:19])
    assert "alice" not in run.stdout
    assert "run-1" not in run.stdout


def test_conflict_in_table_mode_is_one_line_on_stderr(cli: Cli) -> None:
    """Table mode reports the error as one readable line on stderr, nothing on stdout."""
    acquire(cli)
    run = cli(
        "lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", principal="bob", fmt="table"
    )
    assert run.code == 3
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1
    assert "CONFLICT" in run.stderr
    assert "Traceback" not in run.text


def test_version_conflict_exits_4_with_both_versions(cli: Cli) -> None:
    """A stale --expected-version exits 4 with current_version and expected_version."""
    run = cli("lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", "--expected-version", "3")
    assert run.code == 4
    error = run.json["error"]
    assert error["code"] == "VERSION_CONFLICT"
    assert (error["current_version"], error["expected_version"]) == (0, 3)


def test_not_found_exits_5(cli: Cli) -> None:
    """Renewing an unknown lease id exits 5 NOT_FOUND."""
    run = cli("lease", "renew", "--lease-id", "lease_nope", "--execution-key", "k")
    assert run.code == 5
    assert run.json["error"]["code"] == "NOT_FOUND"


def test_another_principals_lease_id_is_not_found(cli: Cli) -> None:
    """Another principal cannot build a proof from someone else's lease id: exit 5."""
    lease = acquire(cli)
    run = cli(
        "lease",
        "release",
        "--lease-id",
        lease["lease_id"],
        "--execution-key",
        "run-1",
        principal="bob",
    )
    assert run.code == 5


def test_force_release_as_agent_exits_6(cli: Cli) -> None:
    """Force release needs owner/admin: an agent gets FORBIDDEN, exit 6."""
    lease = acquire(cli)
    run = cli("lease", "force-release", lease["lease_id"], principal="bob")
    assert run.code == 6
    assert run.json["error"]["code"] == "FORBIDDEN"


def test_listing_others_leases_as_agent_exits_6(cli: Cli) -> None:
    """An agent listing everyone's leases is FORBIDDEN."""
    assert cli("lease", "list", "--owner", "*").code == 6


def test_changed_request_under_the_same_key_exits_7(cli: Cli) -> None:
    """Reusing an execution key for a different request is IDEMPOTENCY_MISMATCH, exit 7."""
    acquire(cli)
    run = cli(
        "lease", "acquire", "deploy", "svc", "--ttl-seconds", "90", "--idempotency-key", "run-1"
    )
    assert run.code == 7
    assert run.json["error"]["code"] == "IDEMPOTENCY_MISMATCH"


def test_in_flight_duplicate_exits_8(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """An IDEMPOTENCY_IN_FLIGHT error from the client maps to exit 8 with its JSON shape."""

    def in_flight(self: LeaseAPI, *args: object, **kwargs: object) -> None:
        raise IdempotencyInFlightError("a request with this key is still being processed")

    monkeypatch.setattr(LeaseAPI, "acquire", in_flight)
    run = cli("lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", "--idempotency-key", "k")
    assert run.code == 8
    assert run.json == {
        "ok": False,
        "action": "lease.acquire",
        "error": {
            "code": "IDEMPOTENCY_IN_FLIGHT",
            "message": "a request with this key is still being processed",
        },
    }


def test_a_second_attempt_of_one_execution_key_exits_8(cli: Cli) -> None:
    """Two processes presenting one --execution-key with their own --attempt never both hold
    the lease: the second exits 8 (IDEMPOTENCY_IN_FLIGHT) while the first holds it, and so
    does one without --attempt; the first attempt retrying replays the same lease."""
    first = cli.ok(
        "lease", "acquire", "deploy", "svc", "--ttl-seconds", "60",
        "--execution-key", "run-1", "--attempt", "pid-1",
    )["lease"]  # fmt: skip
    for other in (["--attempt", "pid-2"], []):
        run = cli(
            "lease", "acquire", "deploy", "svc", "--ttl-seconds", "60",
            "--execution-key", "run-1", *other,
        )  # fmt: skip
        assert run.code == 8, run.text
        assert run.json["error"]["code"] == "IDEMPOTENCY_IN_FLIGHT"
    again = cli.ok(
        "lease", "acquire", "deploy", "svc", "--ttl-seconds", "60",
        "--execution-key", "run-1", "--attempt", "pid-1",
    )  # fmt: skip
    assert again["status"] == "replayed"
    assert (again["lease"]["lease_id"], again["lease"]["epoch"]) == (
        first["lease_id"],
        first["epoch"],
    )


def test_an_attempt_without_an_execution_key_exits_2(cli: Cli) -> None:
    """--attempt names an attempt of an execution: without --execution-key it is refused
    (VALIDATION_ERROR, exit 2) and nothing is acquired."""
    run = cli("lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", "--attempt", "pid-1")
    assert run.code == 2
    assert "--execution-key" in run.json["error"]["message"]
    assert cli.ok("lease", "inspect", "deploy", "svc")["info"]["held"] is False


def test_wrong_execution_key_exits_9(cli: Cli) -> None:
    """Renewing with another execution's key is LEASE_LOST, exit 9 (never corrected)."""
    lease = acquire(cli)
    run = cli("lease", "renew", "--lease-id", lease["lease_id"], "--execution-key", "other")
    assert run.code == 9
    assert run.json["error"]["code"] == "LEASE_LOST"


def test_every_lease_proof_refuses_a_wrong_lease_id_and_a_wrong_key(cli: Cli) -> None:
    """Each command that takes a lease proof (``--lease-id`` with ``--execution-key``: lease
    renew, transfer, release, handoff create) exits 5 NOT_FOUND for an unknown lease id and
    9 LEASE_LOST for another execution's key (never corrected), and the lease stays held
    (one proof for all: ``_client.leases.proof_by_id``)."""
    lease = acquire(cli)
    transfer = ("--to-principal", "bob", "--new-execution-key", "run-2", "--ttl-seconds", "60")
    commands: list[tuple[str, ...]] = [
        ("lease", "renew"),
        ("lease", "transfer", *transfer),
        ("lease", "release"),
        ("handoff", "create", "bob", "doc-1"),
    ]
    for command in commands:
        unknown = cli(*command, "--lease-id", "lease_nope", "--execution-key", "run-1")
        assert (unknown.code, unknown.json["error"]["code"]) == (5, "NOT_FOUND"), command
        proof = ("--lease-id", lease["lease_id"], "--execution-key", "other")
        wrong = cli(*command, *proof)
        assert (wrong.code, wrong.json["error"]["code"]) == (9, "LEASE_LOST"), command
    info = cli.ok("lease", "inspect", "deploy", "svc")["info"]
    assert info["held"] is True
    assert info["lease"]["lease_id"] == lease["lease_id"]
    assert cli.ok("handoff", "inbox", principal="bob")["handoffs"] == []


@pytest.mark.parametrize("command", ["release", "renew"])
def test_release_without_execution_key_says_how_to_pass_it(cli: Cli, command: str) -> None:
    """Releasing or renewing your keyed lease without --execution-key, or with another one,
    stays exit 9 LEASE_LOST, with a message saying the lease is held by you (under an
    execution key, or a different one) and naming --execution-key, without showing either
    key; it stays held."""
    lease = acquire(cli)
    run = cli("lease", command, "--lease-id", lease["lease_id"])
    assert run.code == 9
    assert run.json["error"]["code"] == "LEASE_LOST"
    assert "is held by you under an execution key" in run.json["error"]["message"]
    assert "--execution-key" in run.json["error"]["message"]
    other = cli("lease", command, "--lease-id", lease["lease_id"], "--execution-key", "run-x")
    assert other.code == 9
    message = other.json["error"]["message"]
    assert "is held by you under a different execution key" in message
    assert "run-1" not in message
    assert "run-x" not in message
    assert cli.ok("lease", "inspect", "deploy", "svc")["info"]["held"]
    assert cli.ok("lease", "show", lease["lease_id"])["lease"]["status"] == "active"


def test_release_after_transfer_exits_9(cli: Cli) -> None:
    """The sender's release after a transfer is LEASE_LOST and touches nothing."""
    lease = acquire(cli)
    cli.ok(
        "lease",
        "transfer",
        "--lease-id",
        lease["lease_id"],
        "--execution-key",
        "run-1",
        "--to-principal",
        "bob",
        "--new-execution-key",
        "run-2",
        "--ttl-seconds",
        "60",
    )
    run = cli("lease", "release", "--lease-id", lease["lease_id"], "--execution-key", "run-1")
    assert run.code == 9
    assert cli.ok("lease", "inspect", "deploy", "svc")["info"]["held"] is True


def test_unreachable_ledger_exits_11(cli: Cli) -> None:
    """A ledger that does not answer is UNAVAILABLE, exit 11, without a traceback."""
    down = Cli("postgresql://nobody@127.0.0.1:1/none", cli.org)
    run = down("lease", "list")
    assert run.code == 11
    assert run.json["error"]["code"] == "UNAVAILABLE"
    table = down("lease", "list", fmt="table")
    assert table.code == 11
    assert table.stderr.count("\n") == 1
    assert "Traceback" not in table.text


def test_ttl_out_of_range_exits_2(cli: Cli) -> None:
    """A TTL of 5 or 86,401 seconds is VALIDATION_ERROR, exit 2, and nothing is written."""
    for ttl in ("5", "86401"):
        run = cli("lease", "acquire", "deploy", "svc", "--ttl-seconds", ttl)
        assert run.code == 2
        assert run.json["error"]["code"] == "VALIDATION_ERROR"
        assert "ttl_seconds" in run.json["error"]["message"]
    assert cli.ok("lease", "inspect", "deploy", "svc")["info"]["version"] == 0


def test_renew_and_release_with_a_retry_key_replay_and_refuse_another_request(cli: Cli) -> None:
    """--idempotency-key on renew and release is a retry key: the same command again is
    'replayed' with the same result (the lease is not extended twice); the key with another
    request exits 7 (IDEMPOTENCY_MISMATCH) and changes nothing."""
    lease = acquire(cli)
    proof = ("--lease-id", lease["lease_id"], "--execution-key", "run-1")
    renew = ("lease", "renew", *proof, "--ttl-seconds", "90", "--idempotency-key", "r-1")
    first = cli.ok(*renew)
    again = cli.ok(*renew)
    assert again["status"] == "replayed"
    assert again["lease"]["version"] == first["lease"]["version"] == 2
    assert again["lease"]["expires_at"] == first["lease"]["expires_at"]
    other = cli("lease", "renew", *proof, "--ttl-seconds", "120", "--idempotency-key", "r-1")
    assert other.code == 7, other.text
    assert other.json["error"]["code"] == "IDEMPOTENCY_MISMATCH"
    assert cli.ok("lease", "inspect", "deploy", "svc")["info"]["lease"]["version"] == 2
    release = ("lease", "release", *proof, "--idempotency-key", "rel-1")
    done = cli.ok(*release)
    replay = cli.ok(*release)
    assert replay["status"] == "replayed"
    assert replay["receipt"] == {**done["receipt"], "replayed": True}


def _lapse(cli: Cli, lease_id: str) -> None:
    """Set the lease's expiry in the past, as if its holder had crashed a while ago."""
    from sqlalchemy import create_engine, text

    engine = create_engine(cli.ledger_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE baton_leases SET expires_at_ms = expires_at_ms - 120000 WHERE lease_id = :i"
            ),
            {"i": lease_id},
        )
    engine.dispose()


@pytest.mark.parametrize("ledger", ["sqlite", "postgresql"])
def test_report_expired_reports_a_lapsed_lease_once(ledger: str, cli: Cli, pg_cli: Cli) -> None:
    """``baton lease report-expired`` records lease.expired (reason 'lapsed') once for a
    lease past its TTL that nobody acted on, prints it, and reports nothing the second
    time; a lease still in effect is not reported; a bad --limit is VALIDATION_ERROR."""
    c = cli if ledger == "sqlite" else pg_cli
    crashed = acquire(c, "crashed", key="run-1")
    acquire(c, "alive", key="run-2")
    _lapse(c, crashed["lease_id"])
    first = c.ok("lease", "report-expired", role="owner")
    assert first["action"] == "lease.report-expired"
    assert [lease["lease_id"] for lease in first["leases"]] == [crashed["lease_id"]]
    assert c.ok("lease", "report-expired", role="owner")["leases"] == []
    events = c.ok("events", "tail", "--kind", "lease.expired", role="owner")["events"]
    assert [(e["subject"], e["payload"]["reason"]) for e in events] == [
        ("deploy/crashed", "lapsed")
    ]
    table = c("lease", "report-expired", fmt="table")
    assert table.code == 0, table.text
    for bad in ("0", "10001", "x"):
        run = c("lease", "report-expired", "--limit", bad)
        assert run.code == 2, run.text
        assert run.json["error"]["code"] == "VALIDATION_ERROR"


def _table_line(table: str, lease_id: str) -> str:
    return next(line for line in table.splitlines() if lease_id in line)


def test_release_of_a_lease_that_had_run_out_says_expired_at_the_top(cli: Cli) -> None:
    """Releasing a lease past its expiry answers exit 0 with the receipt's top-level status
    'expired' (JSON) and the title 'lease.release: expired' (table), not 'ok', so a script
    checking ``.status`` sees that its protection had lapsed; a live release stays 'ok'."""
    lapsed = acquire(cli, "lapsed", key="run-1")
    live = acquire(cli, "live", key="run-2")
    _lapse(cli, lapsed["lease_id"])
    args = ("lease", "release", "--execution-key")
    got = cli.ok(*args, "run-1", "--lease-id", lapsed["lease_id"])
    assert (got["status"], got["receipt"]["status"]) == ("expired", "expired")
    assert cli.ok(*args, "run-2", "--lease-id", live["lease_id"])["status"] == "ok"
    again = acquire(cli, "lapsed", key="run-3")
    _lapse(cli, again["lease_id"])
    run = cli(*args, "run-3", "--lease-id", again["lease_id"], fmt="table")
    assert run.code == 0, run.text
    assert "lease.release: expired" in run.stdout
    assert "had already expired" in run.stderr


def test_tables_show_a_lease_past_its_expiry_as_expired(cli: Cli) -> None:
    """``lease list --all`` and ``lease report-expired`` show a lease still 'active' on its
    record but past its expiry as 'expired' in the table; the JSON keeps 'active'."""
    crashed = acquire(cli, "crashed", key="run-1")
    alive = acquire(cli, "alive", key="run-2")
    _lapse(cli, crashed["lease_id"])
    listed = cli.ok("lease", "list", "--all")["leases"]
    assert {x["lease_id"]: x["status"] for x in listed} == {
        crashed["lease_id"]: "active",
        alive["lease_id"]: "active",
    }
    table = cli("lease", "list", "--all", fmt="table").stdout
    assert " expired " in _table_line(table, crashed["lease_id"])
    assert " active " in _table_line(table, alive["lease_id"])
    reported = cli("lease", "report-expired", role="owner", fmt="table").stdout
    assert " expired " in _table_line(reported, crashed["lease_id"])
    assert alive["lease_id"] not in reported


def _field(table: str, name: str) -> str:
    """The value of field ``name`` in the one-object table of a show command."""
    line = next(line for line in table.splitlines() if line.startswith(f"│ {name} "))
    return line.split("│")[2].strip()


def test_show_and_inspect_do_not_call_a_lease_past_its_expiry_active(cli: Cli) -> None:
    """``lease show`` of a lease still 'active' on its record but past its expiry shows
    status 'expired' in the table, as ``lease list`` does (the JSON keeps 'active');
    ``lease inspect`` says it is not held and shows no lease."""
    crashed = acquire(cli, "crashed", key="run-1")
    alive = acquire(cli, "alive", key="run-2")
    _lapse(cli, crashed["lease_id"])
    assert cli.ok("lease", "show", crashed["lease_id"])["lease"]["status"] == "active"
    shown = cli("lease", "show", crashed["lease_id"], fmt="table")
    assert shown.code == 0, shown.text
    assert _field(shown.stdout, "status") == "expired"
    alive_table = cli("lease", "show", alive["lease_id"], fmt="table").stdout
    assert _field(alive_table, "status") == "active"
    inspected = cli("lease", "inspect", "deploy", "crashed", fmt="table").stdout
    assert (_field(inspected, "held"), _field(inspected, "lease")) == ("no", "-")
    assert " active " not in inspected


def test_show_prints_a_lease_by_id_to_its_holder_and_owners_only(cli: Cli) -> None:
    """``baton lease show LEASE_ID``: the holder and an owner see the generation (also after
    it ended); another agent and an unknown id get NOT_FOUND (exit 5)."""
    lease = acquire(cli)
    mine = cli.ok("lease", "show", lease["lease_id"])
    assert mine["action"] == "lease.show"
    assert (mine["lease"]["lease_id"], mine["lease"]["epoch"]) == (lease["lease_id"], 1)
    cli.ok("lease", "release", "--lease-id", lease["lease_id"], "--execution-key", "run-1")
    ended = cli.ok("lease", "show", lease["lease_id"], principal="boss", role="owner")
    assert ended["lease"]["status"] == "released"
    for run in (
        cli("lease", "show", lease["lease_id"], principal="bob"),
        cli("lease", "show", "lease_unknown"),
    ):
        assert run.code == 5, run.text
        assert run.json["error"]["code"] == "NOT_FOUND"


def test_release_table_shows_the_released_lease_field_by_field(cli: Cli) -> None:
    """The table of a release receipt names each field of the lease it carries on a row of
    its own (``lease.epoch``), not the whole lease as JSON in one cell."""
    lease = acquire(cli)
    proof = ("--lease-id", lease["lease_id"], "--execution-key", "run-1")
    out = cli("lease", "release", *proof, fmt="table")
    assert out.code == 0, out.text
    assert _field(out.stdout, "status") == "released"
    assert _field(out.stdout, "lease.lease_id") == lease["lease_id"]
    assert _field(out.stdout, "lease.epoch") == "1"
    assert _field(out.stdout, "lease.status") == "released"
    assert '"lease_id"' not in out.stdout


def test_free_form_json_stays_json_in_a_table(cli: Cli) -> None:
    """A checkpoint's state (free-form JSON, not a record) stays one JSON cell in the
    table, not split into rows."""
    out = cli("checkpoint", "save", "subj", "k", '{"a": {"b": [1, 2]}, "c": 3}', fmt="table")
    assert out.code == 0, out.text
    assert _field(out.stdout, "state") == '{"a": {"b": [1, 2]}, "c": 3}'
    assert "state.a" not in out.stdout
