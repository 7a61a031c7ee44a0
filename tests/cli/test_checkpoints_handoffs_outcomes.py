"""``baton checkpoint|handoff|outcome ...`` through Typer's runner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect_baton._rules.handoffs import STATUS_NEEDS_PARTY

from .conftest import Cli


def acquire(cli: Cli, rid: str = "svc", key: str = "run-1", **kw: Any) -> dict[str, Any]:
    receipt = cli.ok(
        "lease", "acquire", "deploy", rid, "--ttl-seconds", "60", "--idempotency-key", key, **kw
    )
    lease: dict[str, Any] = receipt["lease"]
    return lease


# ----------------------------------------------------------------------------- checkpoints


def test_checkpoint_save_inline_json_and_get_it_back(cli: Cli) -> None:
    """Inline JSON state is saved (version 1, sha256 hash) and read back by get."""
    saved = cli.ok("checkpoint", "save", "doc-1", "progress", '{"line": 40}')["checkpoint"]
    assert (saved["version"], saved["state"]) == (1, {"line": 40})
    assert saved["state_hash"].startswith("sha256:")
    got = cli.ok("checkpoint", "get", "doc-1", "progress")["checkpoint"]
    assert got == saved


def test_checkpoint_save_reads_state_from_a_file(cli: Cli, tmp_path: Path) -> None:
    """A file path as STATE is read as the JSON object."""
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"files": ["a.py", "b.py"]}), encoding="utf-8")
    saved = cli.ok("checkpoint", "save", "doc-1", "progress", str(path))["checkpoint"]
    assert saved["state"] == {"files": ["a.py", "b.py"]}


def test_checkpoint_save_reads_state_from_stdin(cli: Cli) -> None:
    """'-' as STATE reads the JSON object from standard input."""
    saved = cli.ok("checkpoint", "save", "doc-1", "progress", "-", input='{"from": "stdin"}\n')
    assert saved["checkpoint"]["state"] == {"from": "stdin"}


def test_checkpoint_history_lists_every_version(cli: Cli) -> None:
    """History returns every version oldest first; a CAS write with the right version works."""
    cli.ok("checkpoint", "save", "doc-1", "progress", '{"n": 1}')
    cli.ok("checkpoint", "save", "doc-1", "progress", '{"n": 2}', "--expected-version", "1")
    versions = cli.ok("checkpoint", "history", "doc-1", "progress")["checkpoints"]
    assert [(v["version"], v["state"]["n"]) for v in versions] == [(1, 1), (2, 2)]
    table = cli("checkpoint", "history", "doc-1", "progress", fmt="table")
    assert table.code == 0
    assert "sha256:" in table.stdout


def test_checkpoint_history_pages_with_limit_and_cursor(cli: Cli) -> None:
    """checkpoint history --limit gives one page, oldest first, whose next_cursor (null on
    the last page) is the --cursor of the next; the table format names it on stderr; a
    --limit above 1,000 exits 2 (VALIDATION_ERROR)."""
    for n in range(3):
        cli.ok("checkpoint", "save", "doc-1", "progress", f'{{"n": {n}}}')
    first = cli.ok("checkpoint", "history", "doc-1", "progress", "--limit", "2")
    assert [v["version"] for v in first["checkpoints"]] == [1, 2]
    assert first["next_cursor"] is not None
    args = ("checkpoint", "history", "doc-1", "progress", "--limit", "2")
    rest = cli.ok(*args, "--cursor", first["next_cursor"])
    assert [v["version"] for v in rest["checkpoints"]] == [3]
    assert rest["next_cursor"] is None
    table = cli("checkpoint", "history", "doc-1", "progress", "--limit", "2", fmt="table")
    assert table.stderr == (
        f"baton checkpoint history: more rows; next page: --cursor {first['next_cursor']}\n"
    )
    over = cli("checkpoint", "history", "doc-1", "progress", "--limit", "101")
    assert over.code == 2
    assert over.json["error"]["code"] == "VALIDATION_ERROR"


def test_checkpoint_delete(cli: Cli) -> None:
    """Another principal's delete exits 6; the writer's deletes it (get then exits 5, the
    history stays); a second delete exits 5."""
    saved = cli.ok("checkpoint", "save", "doc-1", "progress", '{"line": 40}')["checkpoint"]
    cid = saved["checkpoint_id"]
    assert cli("checkpoint", "delete", cid, principal="bob").code == 6
    gone = cli.ok("checkpoint", "delete", cid)["checkpoint"]
    assert gone["checkpoint_id"] == cid
    assert cli("checkpoint", "get", "doc-1", "progress").code == 5
    assert len(cli.ok("checkpoint", "history", "doc-1", "progress")["checkpoints"]) == 1
    again = cli("checkpoint", "delete", cid)
    assert again.code == 5
    assert again.json["error"]["code"] == "NOT_FOUND"


def test_checkpoint_cas_with_a_stale_version_exits_4(cli: Cli) -> None:
    """A checkpoint save with a stale --expected-version exits 4 with both versions."""
    cli.ok("checkpoint", "save", "doc-1", "progress", '{"n": 1}')
    run = cli("checkpoint", "save", "doc-1", "progress", '{"n": 2}', "--expected-version", "0")
    assert run.code == 4
    error = run.json["error"]
    assert (error["code"], error["current_version"], error["expected_version"]) == (
        "VERSION_CONFLICT",
        1,
        0,
    )


def test_checkpoint_get_of_a_missing_checkpoint_exits_5(cli: Cli) -> None:
    """Get of a checkpoint that does not exist is NOT_FOUND, exit 5."""
    run = cli("checkpoint", "get", "doc-1", "progress")
    assert run.code == 5
    assert run.json["error"]["code"] == "NOT_FOUND"


def test_checkpoint_get_needs_subject_and_kind_or_id_exits_2(cli: Cli) -> None:
    """Get with both SUBJECT_ID KIND and --id, or with neither, is a usage error (exit 2,
    VALIDATION_ERROR) naming the mix-up, as a receipt of ``checkpoint.get``."""
    both = cli("checkpoint", "get", "doc-1", "progress", "--id", "ckpt_x")
    assert (both.code, both.json["ok"], both.json["action"]) == (2, False, "checkpoint.get")
    assert both.json["error"] == {
        "code": "VALIDATION_ERROR",
        "message": "give either SUBJECT_ID KIND or --id, not both",
    }
    neither = cli("checkpoint", "get", fmt="table")
    assert neither.code == 2
    assert neither.stderr == (
        "baton checkpoint get: VALIDATION_ERROR: missing SUBJECT_ID and KIND (or --id)\n"
    )


def test_fenced_checkpoint_after_release_exits_10(cli: Cli) -> None:
    """A save fenced by a lease that is no longer current is STALE_FENCE, exit 10."""
    lease = acquire(cli)
    cli.ok("checkpoint", "save", "doc-1", "progress", '{"n": 1}', "--fence", lease["lease_id"])
    cli.ok("lease", "release", "--lease-id", lease["lease_id"], "--execution-key", "run-1")
    run = cli("checkpoint", "save", "doc-1", "progress", '{"n": 2}', "--fence", lease["lease_id"])
    assert run.code == 10
    assert run.json["error"]["code"] == "STALE_FENCE"
    assert cli.ok("checkpoint", "get", "doc-1", "progress")["checkpoint"]["version"] == 1


def test_malformed_json_state_is_a_readable_validation_error(cli: Cli) -> None:
    """Malformed inline JSON exits 2 with a one-line message and no traceback."""
    run = cli("checkpoint", "save", "doc-1", "progress", '{"line": ', fmt="table")
    assert run.code == 2
    assert "not valid JSON" in run.stderr
    assert run.stderr.count("\n") == 1
    assert "Traceback" not in run.text
    as_json = cli("checkpoint", "save", "doc-1", "progress", "{oops")
    assert as_json.code == 2
    assert as_json.json["error"]["code"] == "VALIDATION_ERROR"


def test_non_object_state_and_unreadable_file_are_validation_errors(
    cli: Cli, tmp_path: Path
) -> None:
    """A JSON list, a missing file and a directory as STATE all exit 2 with a message."""
    for source, needle in (
        ("[1, 2]", "JSON object"),
        (str(tmp_path / "missing.json"), "neither JSON text nor an existing file"),
        (str(tmp_path), "cannot read state file"),
    ):
        run = cli("checkpoint", "save", "doc-1", "progress", source)
        assert run.code == 2, source
        assert needle in run.json["error"]["message"]
    empty_stdin = cli("checkpoint", "save", "doc-1", "progress", "-", input="")
    assert empty_stdin.code == 2


# ----------------------------------------------------------------------------- handoffs


def test_handoff_with_lease_and_checkpoint_moves_both_to_the_recipient(cli: Cli) -> None:
    """Create, inbox, accept: the recipient holds the lease and reads the checkpoint."""
    lease = acquire(cli)
    ck = cli.ok("checkpoint", "save", "doc-1", "progress", '{"n": 7}')["checkpoint"]
    created = cli.ok(
        "handoff",
        "create",
        "bob",
        "doc-1",
        "--checkpoint-id",
        ck["checkpoint_id"],
        "--message",
        "your turn",
        "--lease-id",
        lease["lease_id"],
        "--execution-key",
        "run-1",
    )["handoff"]
    assert created["status"] == "pending"
    assert cli.ok("handoff", "inbox")["handoffs"] == []
    inbox = cli.ok("handoff", "inbox", principal="bob")["handoffs"]
    assert [h["handoff_id"] for h in inbox] == [created["handoff_id"]]
    accepted = cli.ok(
        "handoff",
        "resolve",
        created["handoff_id"],
        "accepted",
        "--execution-key",
        "bob-run",
        principal="bob",
    )["handoff"]
    assert accepted["status"] == "accepted"
    assert (accepted["lease"]["owner"], accepted["lease"]["execution_key"]) == ("bob", "bob-run")
    state = cli.ok("checkpoint", "get", "--id", ck["checkpoint_id"], principal="bob")
    assert state["checkpoint"]["state"] == {"n": 7}
    # Anyone else (neither writer nor recipient, nor owner/admin) is told it does not exist.
    hidden = cli("checkpoint", "get", "--id", ck["checkpoint_id"], principal="carol")
    assert (hidden.code, hidden.json["error"]["code"]) == (5, "NOT_FOUND")
    shown_to_admin = cli.ok(
        "checkpoint", "get", "--id", ck["checkpoint_id"], principal="root", role="admin"
    )
    assert shown_to_admin["checkpoint"]["state"] == {"n": 7}
    shown = cli.ok("handoff", "show", created["handoff_id"])["handoff"]
    assert shown["status"] == "accepted"


def test_second_resolve_exits_5_and_foreign_resolve_exits_2(cli: Cli) -> None:
    """Only the target may resolve (else the seed's VALIDATION_ERROR, 2); a second resolve
    is not found (5)."""
    hid = cli.ok("handoff", "create", "bob", "doc-1")["handoff"]["handoff_id"]
    foreign = cli("handoff", "resolve", hid, "accepted", principal="carol")
    assert foreign.code == 2
    assert foreign.json["error"]["code"] == "VALIDATION_ERROR"
    cli.ok("handoff", "resolve", hid, "rejected", "--note", "not now", principal="bob")
    again = cli("handoff", "resolve", hid, "accepted", principal="bob")
    assert again.code == 5
    assert again.json["error"]["code"] == "NOT_FOUND"
    # ... and the help says so (it once promised 6, FORBIDDEN, for the foreign resolve)
    shown = " ".join(cli("handoff", "resolve", "--help").stdout.split())
    assert "someone else exits 2 (VALIDATION_ERROR" in shown
    assert "FORBIDDEN" not in shown


def test_unknown_handoff_status_is_a_usage_error(cli: Cli) -> None:
    """A resolution other than accepted/rejected exits 2 with a readable message."""
    run = cli("handoff", "resolve", "handoff_x", "maybe", principal="bob", fmt="table")
    assert run.code == 2
    assert "maybe" in run.stderr
    assert "Traceback" not in run.text


def test_a_lifetime_out_of_range_names_the_range(cli: Cli) -> None:
    """``handoff create --expires-in-seconds`` and ``checkpoint save --ttl-seconds`` outside
    1..31,622,400 exit 2 naming that range (as the help and the REST API state it), not
    "must be a positive integer"."""
    for value in ("99999999999", "0"):
        run = cli("handoff", "create", "bob", "s", "--expires-in-seconds", value)
        assert run.code == 2, run.text
        assert run.json["error"]["message"] == (
            f"expires_in_seconds must be an integer from 1 to 31622400 seconds, got {value}"
        )
    run = cli("checkpoint", "save", "s", "plan", "{}", "--ttl-seconds", "99999999999")
    assert run.code == 2, run.text
    assert "from 1 to 31622400 seconds, got 99999999999" in run.json["error"]["message"]


def test_handoff_inbox_table_lists_pending_handoffs(cli: Cli) -> None:
    """The inbox table shows the handoff id and sender."""
    hid = cli.ok("handoff", "create", "bob", "doc-1")["handoff"]["handoff_id"]
    run = cli("handoff", "inbox", principal="bob", fmt="table")
    assert run.code == 0
    assert hid in run.stdout
    assert "alice" in run.stdout


def test_handoff_inbox_all_lists_everyone_s_for_an_owner_only(cli: Cli) -> None:
    """``--all`` (or ``--party '*'``) lists every pending handoff of the org to an owner,
    ``--status`` filters it; an agent gets exit 6 (FORBIDDEN); ``--party`` with one's own
    name lists what one sent or received; ``--party '*' --all`` is ``--all``; ``--status``
    alone, ``--limit 0`` and ``--all`` with ``--party`` naming a principal exit 2."""
    first = cli.ok("handoff", "create", "bob", "doc-1")["handoff"]["handoff_id"]
    second = cli.ok("handoff", "create", "dave", "doc-2", principal="carol")["handoff"]
    cli.ok("handoff", "resolve", second["handoff_id"], "rejected", principal="dave")
    everyone = cli.ok("handoff", "inbox", "--all", principal="boss", role="owner")
    assert [h["handoff_id"] for h in everyone["handoffs"]] == [first]
    starred = cli.ok(
        "handoff", "inbox", "--party", "*", "--status", "any", principal="boss", role="admin"
    )
    assert [h["handoff_id"] for h in starred["handoffs"]] == [first, second["handoff_id"]]
    rejected = cli.ok(
        "handoff", "inbox", "--all", "--status", "rejected", principal="boss", role="owner"
    )
    assert [h["handoff_id"] for h in rejected["handoffs"]] == [second["handoff_id"]]
    both = cli.ok("handoff", "inbox", "--party", "*", "--all", principal="boss", role="owner")
    assert [h["handoff_id"] for h in both["handoffs"]] == [first]
    refused = cli("handoff", "inbox", "--all", principal="bob")
    assert refused.code == 6
    assert refused.json["error"]["code"] == "FORBIDDEN"
    own = cli.ok("handoff", "inbox", "--party", "alice")["handoffs"]
    assert [h["handoff_id"] for h in own] == [first]
    for args in (("--status", "pending"), ("--all", "--limit", "0"), ("--all", "--party", "bob")):
        bad = cli("handoff", "inbox", *args, principal="boss", role="owner")
        assert bad.code == 2, args
        assert bad.json["error"]["code"] == "VALIDATION_ERROR"
    # the message REST and MCP give for the same request (tests/rest, tests/mcp)
    no_party = cli("handoff", "inbox", "--status", "pending", principal="boss", role="owner")
    assert no_party.json["error"]["message"] == STATUS_NEEDS_PARTY


# ----------------------------------------------------------------------------- outcomes


def test_outcome_record_with_key_value_evidence_and_list(cli: Cli) -> None:
    """Evidence as repeated kind=...,uri=...,digest=... is recorded and listed."""
    out = cli.ok(
        "outcome",
        "record",
        "doc-1",
        "succeeded",
        "--evidence",
        "kind=file,uri=file:///tmp/a,b.py,digest=sha256:ab",
        "--evidence",
        "kind=log,uri=s3://bucket/log.txt,note=run log",
    )["outcome"]
    assert out["status"] == "succeeded"
    assert out["evidence"] == [
        {"kind": "file", "uri": "file:///tmp/a,b.py", "digest": "sha256:ab", "note": None},
        {"kind": "log", "uri": "s3://bucket/log.txt", "digest": None, "note": "run log"},
    ]
    listed = cli.ok("outcome", "list", "doc-1")["outcomes"]
    assert [o["outcome_id"] for o in listed] == [out["outcome_id"]]
    assert cli("outcome", "list", fmt="table").code == 0


def test_outcome_record_with_json_evidence_and_fence(cli: Cli) -> None:
    """Evidence as a JSON list works, and a current fence records its epoch."""
    lease = acquire(cli)
    evidence = json.dumps([{"kind": "file", "uri": "a.py"}, {"kind": "file", "uri": "b.py"}])
    out = cli.ok(
        "outcome",
        "record",
        "doc-1",
        "failed",
        "--evidence",
        evidence,
        "--fence",
        lease["lease_id"],
        "--lease-id",
        lease["lease_id"],
    )["outcome"]
    assert [e["uri"] for e in out["evidence"]] == ["a.py", "b.py"]
    assert out["fence_epoch"] == lease["epoch"]


def test_succeeded_without_evidence_and_bad_evidence_exit_2(cli: Cli) -> None:
    """A succeeded outcome needs evidence; malformed --evidence is a validation error."""
    assert cli("outcome", "record", "doc-1", "succeeded").code == 2
    bad = cli("outcome", "record", "doc-1", "failed", "--evidence", "color=blue")
    assert bad.code == 2
    assert "--evidence" in bad.json["error"]["message"]
    assert cli("outcome", "record", "doc-1", "failed", "--evidence", "[1]").code == 2


def test_fenced_outcome_after_transfer_exits_10(cli: Cli) -> None:
    """An outcome fenced by a lease the sender transferred away is STALE_FENCE, exit 10."""
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
    run = cli("outcome", "record", "doc-1", "failed", "--fence", lease["lease_id"])
    assert run.code == 10
    assert run.json["error"]["code"] == "STALE_FENCE"


def test_fence_of_unknown_lease_is_stale_fence_on_both_writes(cli: Cli) -> None:
    """``--fence`` with a lease id nobody holds is refused as Python refuses it: STALE_FENCE,
    exit 10, naming the fence (not NOT_FOUND, exit 5)."""
    message = "fence lease lease_nope is not a current lease of the writer"
    save = cli("checkpoint", "save", "doc-1", "progress", "{}", "--fence", "lease_nope")
    record = cli("outcome", "record", "doc-1", "failed", "--fence", "lease_nope")
    for run in (save, record):
        assert run.code == 10, run.text
        assert run.json["error"] == {"code": "STALE_FENCE", "message": message}
    assert cli("checkpoint", "get", "doc-1", "progress").code == 5  # nothing was written


def test_fence_of_another_principals_lease_is_stale_fence(cli: Cli) -> None:
    """bob presenting alice's lease id (the lease she handed to him and its old id) is
    STALE_FENCE, exit 10; an owner, who can read alice's lease, is refused by the write
    itself, which records ``fence.rejected`` as the Python API does."""
    lease = acquire(cli)
    run = cli(
        "checkpoint", "save", "doc-1", "progress", "{}", "--fence", lease["lease_id"],
        principal="bob",
    )  # fmt: skip
    assert run.code == 10, run.text
    assert run.json["error"]["code"] == "STALE_FENCE"
    owner = cli(
        "outcome", "record", "doc-1", "failed", "--fence", lease["lease_id"],
        principal="carol", role="owner",
    )  # fmt: skip
    assert owner.code == 10, owner.text
    assert owner.json["error"]["code"] == "STALE_FENCE"
    events = cli.ok("events", "tail", principal="carol", role="owner")["events"]
    rejected = [e for e in events if e["kind"] == "fence.rejected"]
    assert [(e["principal"], e["payload"]["write"]) for e in rejected] == [
        ("carol", "outcome.record")
    ]
