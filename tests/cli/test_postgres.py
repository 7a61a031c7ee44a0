"""A subset of the CLI against the PostgreSQL ledger (fresh org per test)."""

from __future__ import annotations

from .conftest import Cli


def test_lease_lifecycle_and_conflict_on_postgres(pg_cli: Cli) -> None:
    """Acquire, conflict (3), renew, release and no_change work on PostgreSQL."""
    lease = pg_cli.ok(
        "lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", "--idempotency-key", "run-1"
    )["lease"]
    conflict = pg_cli("lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", principal="bob")
    assert conflict.code == 3
    assert conflict.json["error"]["code"] == "CONFLICT"
    proof = ("--lease-id", lease["lease_id"], "--execution-key", "run-1")
    assert pg_cli.ok("lease", "renew", *proof)["lease"]["version"] == 2
    stale = pg_cli("lease", "release", *proof, "--expected-version", "1")
    assert stale.code == 4
    assert pg_cli.ok("lease", "release", *proof)["receipt"]["status"] == "released"
    assert pg_cli.ok("lease", "release", *proof)["status"] == "no_change"


def test_checkpoint_from_stdin_and_handoff_on_postgres(pg_cli: Cli) -> None:
    """Checkpoint from stdin, handoff with the lease, accept: recipient holds it."""
    lease = pg_cli.ok(
        "lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", "--idempotency-key", "run-1"
    )["lease"]
    ck = pg_cli.ok("checkpoint", "save", "doc", "progress", "-", input='{"n": 3}')["checkpoint"]
    hid = pg_cli.ok(
        "handoff",
        "create",
        "bob",
        "doc",
        "--checkpoint-id",
        ck["checkpoint_id"],
        "--lease-id",
        lease["lease_id"],
        "--execution-key",
        "run-1",
    )["handoff"]["handoff_id"]
    accepted = pg_cli.ok("handoff", "resolve", hid, "accepted", principal="bob")["handoff"]
    assert accepted["lease"]["owner"] == "bob"
    fenced = pg_cli(
        "checkpoint", "save", "doc", "progress", '{"n": 4}', "--fence", lease["lease_id"]
    )
    assert fenced.code == 10


def test_outcomes_events_and_audit_on_postgres(pg_cli: Cli) -> None:
    """Outcome record/list, events tail and a clean audit on PostgreSQL."""
    pg_cli.ok("outcome", "record", "doc", "succeeded", "--evidence", "kind=file,uri=a.py")
    assert len(pg_cli.ok("outcome", "list", "doc")["outcomes"]) == 1
    events = pg_cli.ok("events", "tail")["events"]
    assert [e["kind"] for e in events] == ["outcome.recorded"]
    assert pg_cli.ok("audit")["audit"]["violations"] == []
    info = pg_cli.ok("db", "current")["info"]
    assert info["up_to_date"] is True
