"""What a new user of ``baton`` hits first: an empty list that names where it looked, the
``list`` names of ``events`` and ``handoff``, suggestions for a mistyped option,
``--execution-key`` on acquire, and a demo summary without measures of another engine."""

from __future__ import annotations

import pytest

from .conftest import Cli


def test_an_empty_list_names_the_org_and_the_filters_it_looked_in(cli: Cli) -> None:
    """A wrong --org (or filter) shows where the empty list was looked for, in the table
    format; the JSON receipt stays the empty list."""
    cli.ok("lease", "acquire", "deploy", "svc", "--ttl-seconds", "60")
    run = cli("--org", "acme", "lease", "list", fmt="table")
    assert run.code == 0, run.text
    assert run.stdout.strip() == "lease.list: no leases in org 'acme' as principal 'alice'"
    run = cli("--org", "acme", "lease", "list", "--resource-type", "deploy", "--all", fmt="table")
    assert "no leases in org 'acme'" in run.stdout
    assert "(--resource-type 'deploy', --all)" in run.stdout
    receipt = cli.ok("--org", "acme", "lease", "list")
    assert receipt == {
        "ok": True,
        "action": "lease.list",
        "status": "ok",
        "leases": [],
        "next_cursor": None,
    }
    events = cli("--org", "acme", "events", "tail", "--kind", "lease.acquired", fmt="table")
    assert events.stdout.strip() == "events.tail: no events in org 'acme' (--kind 'lease.acquired')"
    keys = cli("keys", "list", "--active-only", fmt="table")
    assert f"keys.list: no keys in org '{cli.org}' (--active-only)" in keys.stdout
    outcomes = cli("outcome", "list", "subj-1", fmt="table")
    assert f"no outcomes in org '{cli.org}'" in outcomes.stdout
    assert "SUBJECT_ID 'subj-1'" in outcomes.stdout


def test_events_list_is_events_tail(cli: Cli) -> None:
    """`baton events list` is `baton events tail` under another name: the same page, the
    receipt's action naming the command given; its help says what it equals."""
    cli.ok("lease", "acquire", "deploy", "svc", "--ttl-seconds", "60")
    tail = cli.ok("events", "tail", "--kind", "lease.acquired")
    listed = cli.ok("events", "list", "--kind", "lease.acquired")
    assert listed["action"] == "events.list"
    assert listed["events"] == tail["events"]
    assert len(listed["events"]) == 1
    assert listed["next_after"] == tail["next_after"]
    help_text = cli("events", "list", "--help", fmt="table").stdout
    assert "same command as 'baton events tail'" in " ".join(help_text.split())


def test_handoff_list_is_handoff_inbox_all_status_any(cli: Cli) -> None:
    """`baton handoff list` lists every handoff of the org, of any status, as `handoff
    inbox --all --status any` does; an agent is refused as there."""
    first = cli.ok("handoff", "create", "bob", "subj-1")["handoff"]
    cli.ok("handoff", "create", "carol", "subj-2")
    cli.ok("handoff", "resolve", first["handoff_id"], "rejected", principal="bob")
    inbox = cli.ok("handoff", "inbox", "--all", "--status", "any", role="owner")
    listed = cli.ok("handoff", "list", role="owner")
    assert listed["action"] == "handoff.list"
    assert listed["handoffs"] == inbox["handoffs"]
    assert len(listed["handoffs"]) == 2
    rejected = cli.ok("handoff", "list", "--status", "rejected", role="owner")["handoffs"]
    assert [h["handoff_id"] for h in rejected] == [first["handoff_id"]]
    assert cli("handoff", "list").code == 6  # FORBIDDEN, as inbox --all is for an agent
    help_text = " ".join(cli("handoff", "list", "--help", fmt="table").stdout.split())
    assert "the same as 'baton handoff inbox --all --status any'" in help_text


@pytest.mark.parametrize(
    ("args", "suggested"),
    [
        (["lease", "acquire", "deploy", "svc", "--ttl", "60"], "--ttl-seconds"),
        (["lease", "acquire", "deploy", "svc", "--ttl=60"], "--ttl-seconds"),
        (["lease", "renew", "--lease-id", "x", "--exec", "k"], "--execution-key"),
        (["lease", "acquire", "deploy", "svc", "--ttl-second", "60"], "--ttl-seconds"),
    ],
)
def test_an_unknown_option_suggests_the_closest_real_one(
    cli: Cli, args: list[str], suggested: str
) -> None:
    """A mistyped option names the options it may have meant, a prefix included (--ttl
    for --ttl-seconds), in JSON and table output alike."""
    run = cli(*args)
    assert run.code == 2
    assert f"(Possible options: {suggested})" in run.json["error"]["message"]
    table = cli(*args, fmt="table")
    assert f"(Possible options: {suggested})" in table.stderr


def test_closest_options_leaves_out_unrelated_and_exact_names() -> None:
    """Suggestions are prefixes and near spellings only; one letter after '--' is too short
    to suggest what it begins."""
    from prefect_baton.cli import closest_options

    options = ["--ttl-seconds", "--execution-key", "--purpose", "--scope"]
    assert closest_options("--ttl", options) == ["--ttl-seconds"]
    assert closest_options("--purpos", options) == ["--purpose"]
    assert closest_options("--zzz", options) == []
    assert "--execution-key" not in closest_options("--e", options)


def test_a_hidden_option_is_not_suggested(cli: Cli) -> None:
    """The deprecated --idempotency-key of acquire is never suggested."""
    run = cli("lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", "--idempotency-keys", "k")
    assert run.code == 2
    assert "--idempotency-key" not in run.json["error"]["message"].replace("--idempotency-keys", "")


def test_acquire_takes_the_execution_key_as_execution_key(cli: Cli) -> None:
    """`lease acquire --execution-key` sets the execution key that renew and release take
    back as --execution-key; --idempotency-key still works there, hidden and deprecated
    (a warning on stderr), and a different value under both names is refused."""
    lease = cli.ok(
        "lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", "--execution-key", "run-1"
    )["lease"]
    assert lease["execution_key"] == "run-1"
    cli.ok("lease", "renew", "--lease-id", lease["lease_id"], "--execution-key", "run-1")
    old = cli(
        "lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", "--idempotency-key", "run-1"
    )
    assert old.code == 0, old.text
    assert old.json["status"] == "replayed"
    assert "deprecated" in old.stderr
    assert "--execution-key" in old.stderr
    both = cli(
        "lease",
        "acquire",
        "deploy",
        "other",
        "--ttl-seconds",
        "60",
        "--execution-key",
        "a",
        "--idempotency-key",
        "b",
    )
    assert both.code == 2
    assert both.json["error"]["code"] == "VALIDATION_ERROR"
    options = cli("lease", "acquire", "--help", fmt="table").stdout.split("Options")[1]
    assert "--execution-key" in options
    assert "--idempotency-key" not in options


def test_demo_summary_marks_crashes_and_pauses_not_applicable_on_prefect(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The Prefect engine injects no crashes or pauses: its summary shows them as n/a in
    the table and null in JSON, while the processes engine shows its counts."""
    from prefect_baton.demo import DemoResult, _print_table

    on_prefect = DemoResult(engine="prefect", files=3, completed=3)
    summary = on_prefect.summary()
    assert summary["crashes"] is None
    assert summary["pauses"] is None
    assert summary["completed"] == 3
    assert summary["engine"] == "prefect"
    _print_table(on_prefect)
    rows = [line for line in capsys.readouterr().out.splitlines() if "researchers" in line]
    assert len(rows) == 2, rows
    assert all("n/a" in row for row in rows), rows
    on_processes = DemoResult(files=3, completed=3, crashes=1, pauses=0)
    assert (on_processes.summary()["crashes"], on_processes.summary()["pauses"]) == (1, 0)
    _print_table(on_processes)
    out = capsys.readouterr().out
    assert "n/a" not in out


def test_reads_in_an_org_where_nothing_was_recorded_warn_of_a_mistyped_org(cli: Cli) -> None:
    """``lease inspect``, ``lease list``, ``events tail`` and ``audit`` in an org with no
    events (a mistyped --org) still answer, exit 0, with a warning on stderr naming the org;
    the JSON on stdout is unchanged, and reads in the org that was used do not warn."""
    cli.ok("lease", "acquire", "deploy", "svc", "--ttl-seconds", "60")
    for args in (
        ("lease", "inspect", "deploy", "svc"),
        ("lease", "list"),
        ("events", "tail"),
        ("audit",),
    ):
        wrong = cli("--org", "acm", *args)
        assert wrong.code == 0, wrong.text
        assert "nothing was ever recorded in org 'acm'" in wrong.stderr, args
        assert wrong.stdout.startswith('{"ok": true'), args
        right = cli(*args)
        assert right.code == 0, right.text
        assert "nothing was ever recorded" not in right.stderr, args
