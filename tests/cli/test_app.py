"""The ``baton`` app as a whole: help, exit code table, usage errors, events, db, audit,
demo forwarding, and that no failure ever prints a traceback."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import types
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from prefect_baton.cli import COMMANDS, EXIT_CODES, SUB_APPS, app, hoist_global_options
from prefect_baton.cli._state import CliState, command
from prefect_baton.errors import ERROR_CODES

from .conftest import CLEAN_ENV, Cli


def test_every_error_code_has_a_distinct_exit_code() -> None:
    """Each design error code maps to its own fixed non-zero exit code (2 shared with usage)."""
    assert set(ERROR_CODES) <= set(EXIT_CODES)
    codes = [EXIT_CODES[c] for c in ERROR_CODES]
    assert len(set(codes)) == len(codes)
    assert EXIT_CODES == {
        "OK": 0,
        "VALIDATION_ERROR": 2,
        "CONFLICT": 3,
        "VERSION_CONFLICT": 4,
        "NOT_FOUND": 5,
        "FORBIDDEN": 6,
        "IDEMPOTENCY_MISMATCH": 7,
        "IDEMPOTENCY_IN_FLIGHT": 8,
        "LEASE_LOST": 9,
        "STALE_FENCE": 10,
        "UNAVAILABLE": 11,
        "UNAUTHENTICATED": 12,
    }


def test_help_lists_commands_and_exit_codes() -> None:
    """`baton --help` lists every command group and the exit code of every error code."""
    result = CliRunner().invoke(app, ["--help"], env=CLEAN_ENV)
    assert result.exit_code == 0
    for name, _ in SUB_APPS:
        assert name in result.stdout
    for name, _, _ in COMMANDS:
        assert name in result.stdout
    for code, number in EXIT_CODES.items():
        assert f"{number:>3}  {code}" in result.stdout


def test_every_command_has_help_text() -> None:
    """Each sub-command's --help renders, with text for every option."""
    runner = CliRunner()
    for group, sub in SUB_APPS:
        for info in sub.registered_commands:
            result = runner.invoke(app, [group, str(info.name), "--help"], env=CLEAN_ENV)
            assert result.exit_code == 0, (group, info.name)
            assert "Usage:" in result.stdout


def test_version_flag_prints_the_version() -> None:
    """`baton --version` prints the package version and exits 0."""
    result = CliRunner().invoke(app, ["--version"], env=CLEAN_ENV)
    assert result.exit_code == 0
    assert "prefect-baton" in result.stdout


def test_missing_option_is_a_readable_usage_error(cli: Cli) -> None:
    """A missing --ttl-seconds exits 2 with one line naming it; JSON mode gets a receipt."""
    run = cli("lease", "acquire", "deploy", "svc", fmt="table")
    assert run.code == 2
    assert "Missing option '--ttl-seconds'" in run.stderr
    assert run.stderr.count("\n") == 1
    assert "Traceback" not in run.text
    as_json = cli("lease", "acquire", "deploy", "svc")
    assert as_json.code == 2
    assert as_json.json["ok"] is False
    assert as_json.json["action"] == "lease.acquire"
    assert as_json.json["error"]["code"] == "VALIDATION_ERROR"
    assert "--ttl-seconds" in as_json.json["error"]["message"]


def test_an_option_missing_its_value_names_the_command(cli: Cli) -> None:
    """``baton lease renew --lease-id`` (no value; Click raises it without a context) names
    the command like every other usage error, in the table line and the JSON action."""
    run = cli("lease", "renew", "--lease-id", fmt="table")
    assert run.code == 2
    assert run.stderr == (
        "baton lease renew: VALIDATION_ERROR: Option '--lease-id' requires an argument. "
        "(see 'baton lease renew --help')\n"
    )
    as_json = cli("lease", "renew", "--lease-id")
    assert as_json.code == 2
    assert as_json.json["action"] == "lease.renew"


def test_negative_ttl_is_a_readable_validation_error(cli: Cli) -> None:
    """--ttl-seconds -5 exits 2 with a message giving the allowed range, no traceback."""
    run = cli("lease", "acquire", "deploy", "svc", "--ttl-seconds", "-5", fmt="table")
    assert run.code == 2
    assert "from 10 to 86400 seconds" in run.stderr
    assert "Traceback" not in run.text


def test_non_integer_ttl_and_bad_format_are_usage_errors(cli: Cli) -> None:
    """A non-integer TTL and an unknown --format both exit 2 with a message."""
    run = cli("lease", "acquire", "deploy", "svc", "--ttl-seconds", "1.5")
    assert run.code == 2
    assert run.json["error"]["code"] == "VALIDATION_ERROR"
    bad_format = cli("lease", "list", fmt="yaml")
    assert bad_format.code == 2
    assert "yaml" in bad_format.stderr


def test_choice_errors_read_without_pydantics_value_error_prefix(cli: Cli) -> None:
    """A value outside an option's or argument's choices (Typer converts it with pydantic)
    is reported as Click words it, without pydantic's ``Value error, `` start."""
    bad_format = cli("lease", "list", fmt="yaml")
    assert bad_format.code == 2
    assert "Value error" not in bad_format.stderr
    assert "'--format' (env var: 'BATON_FORMAT'): 'yaml' is not one of 'table', 'json'." in (
        bad_format.stderr
    )
    bad_status = cli("handoff", "resolve", "hoff_x", "accept")
    assert bad_status.code == 2
    assert bad_status.json["error"]["message"] == (
        "Invalid value for 'STATUS': 'accept' is not one of 'accepted', 'rejected'."
    )


def test_unknown_command_is_a_usage_error(cli: Cli) -> None:
    """An unknown command exits 2 with a readable message."""
    run = cli("lease", "grab", fmt="table")
    assert run.code == 2
    assert "No such command" in run.stderr


def test_bad_role_and_bad_ledger_url_are_validation_errors(cli: Cli) -> None:
    """An unknown --role or a non-SQL ledger URL exits 2 before anything is written."""
    assert cli("lease", "list", role="king").code == 2
    run = Cli("mysql://x@localhost/db", cli.org)("lease", "list")
    assert run.code == 2
    assert "sqlite:// or postgresql://" in run.json["error"]["message"]


def test_unexpected_failure_is_one_line_without_traceback(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception exits 1 with one line (INTERNAL_ERROR), not a traceback."""
    from prefect_baton._client.sync import LeaseAPI

    def boom(self: LeaseAPI, *args: object, **kwargs: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(LeaseAPI, "list", boom)
    run = cli("lease", "list", fmt="table")
    assert run.code == 1
    assert "disk on fire" in run.stderr
    assert "Traceback" not in run.text
    as_json = cli("lease", "list")
    assert as_json.json["error"]["code"] == "INTERNAL_ERROR"


def test_environment_supplies_the_global_options(sqlite_ledger: str) -> None:
    """BATON_LEDGER_URL, BATON_ORG, BATON_PRINCIPAL and BATON_FORMAT are the defaults."""
    env = {
        **CLEAN_ENV,
        "BATON_LEDGER_URL": sqlite_ledger,
        "BATON_ORG": "env-org",
        "BATON_PRINCIPAL": "env-agent",
        "BATON_FORMAT": "json",
    }
    runner = CliRunner()
    result = runner.invoke(
        app, ["lease", "acquire", "deploy", "svc", "--ttl-seconds", "60"], env=env
    )
    assert result.exit_code == 0, result.output
    assert '"owner": "env-agent"' in result.stdout
    other_org = Cli(sqlite_ledger, "another-org")
    assert other_org.ok("lease", "inspect", "deploy", "svc")["info"]["held"] is False


# ----------------------------------------------------------------------------- events


def test_events_tail_pages_with_after_and_next_after(cli: Cli) -> None:
    """events tail returns events after --after in order, and next_after for the next page."""
    cli.ok("lease", "acquire", "deploy", "a", "--ttl-seconds", "60")
    cli.ok("checkpoint", "save", "doc", "progress", '{"n": 1}')
    cli.ok("handoff", "create", "bob", "doc")
    first = cli.ok("events", "tail", "--limit", "2")
    kinds = [e["kind"] for e in first["events"]]
    assert kinds == ["lease.acquired", "checkpoint.saved"]
    rest = cli.ok("events", "tail", "--after", str(first["next_after"]))
    assert [e["kind"] for e in rest["events"]] == ["handoff.created"]
    empty = cli.ok("events", "tail", "--after", str(rest["next_after"]))
    assert empty["events"] == []
    assert empty["next_after"] == rest["next_after"]
    only = cli.ok("events", "tail", "--kind", "handoff.created")["events"]
    assert len(only) == 1
    assert cli("events", "tail", fmt="table").code == 0


def test_events_tail_pages_with_cursor(cli: Cli) -> None:
    """events tail --cursor continues after the page whose next_cursor it is; a page
    exactly --limit long at the end of the stream has next_cursor null, one with an event
    after it names a cursor, and the table format names it on stderr (as every paged list
    does), keeping stdout the table alone."""
    cli.ok("lease", "acquire", "deploy", "a", "--ttl-seconds", "60")
    cli.ok("checkpoint", "save", "doc", "progress", '{"n": 1}')
    assert cli.ok("events", "tail", "--limit", "2")["next_cursor"] is None
    cli.ok("handoff", "create", "bob", "doc")
    first = cli.ok("events", "tail", "--limit", "2")
    assert first["next_cursor"] is not None
    rest = cli.ok("events", "tail", "--limit", "2", "--cursor", first["next_cursor"])
    assert [e["kind"] for e in rest["events"]] == ["handoff.created"]
    assert rest["next_cursor"] is None
    assert rest["next_after"] == rest["events"][0]["seq"]
    table = cli("events", "tail", "--limit", "2", fmt="table")
    assert table.stderr == (
        f"baton events tail: more rows; next page: --cursor {first['next_cursor']}\n"
    )
    assert "next_" not in table.stdout
    assert first["next_cursor"] not in table.stdout
    last = cli("events", "tail", fmt="table")
    assert (last.code, last.stderr) == (0, "")
    assert "next_" not in last.stdout


def test_events_tail_refuses_after_with_cursor(cli: Cli) -> None:
    """--after with --cursor is VALIDATION_ERROR (exit 2) whatever --after is, 0 too;
    no --after and no --cursor reads from the start."""
    cli.ok("lease", "acquire", "deploy", "a", "--ttl-seconds", "60")
    cli.ok("checkpoint", "save", "doc", "progress", '{"n": 1}')
    cursor = cli.ok("events", "tail", "--limit", "1")["next_cursor"]
    for after in ("0", "1"):
        run = cli("events", "tail", "--after", after, "--cursor", cursor)
        assert run.code == 2
        assert run.json["error"] == {
            "code": "VALIDATION_ERROR",
            "message": "give --after or --cursor, not both",
        }
    assert len(cli.ok("events", "tail")["events"]) == 2


def test_events_tail_rejects_bad_paging(cli: Cli) -> None:
    """A negative --after (the message names --after), a zero --limit and a zero
    --interval exit 2."""
    negative = cli("events", "tail", "--after", "-1")
    assert negative.code == 2
    assert negative.json["error"]["message"] == "--after must be an integer from 0 to 2**63 - 1"
    assert cli("events", "tail", "--after", "-1", "--follow").code == 2
    assert cli("events", "tail", "--limit", "0").code == 2
    unknown = cli("events", "tail", "--kind", "nope")
    assert unknown.code == 2
    assert "unknown event kind 'nope'" in unknown.json["error"]["message"]
    assert cli("events", "tail", "--follow", "--interval", "0").code == 2


def test_events_tail_by_resource_and_subject(cli: Cli) -> None:
    """--resource-type with --resource-id keeps the events of that resource's leases,
    --subject those of that subject; --follow takes them too."""
    cli.ok("lease", "acquire", "deploy", "a", "--ttl-seconds", "60")
    cli.ok("lease", "acquire", "deploy", "b", "--ttl-seconds", "60")
    cli.ok("checkpoint", "save", "a", "progress", '{"n": 1}')
    mine = cli.ok("events", "tail", "--resource-type", "deploy", "--resource-id", "a")
    assert [(e["kind"], e["subject"]) for e in mine["events"]] == [("lease.acquired", "deploy/a")]
    assert mine["next_after"] == mine["events"][0]["seq"]
    by_subject = cli.ok("events", "tail", "--subject", "a")["events"]
    assert [e["kind"] for e in by_subject] == ["checkpoint.saved"]
    none = cli.ok(
        "events",
        "tail",
        "--resource-type",
        "deploy",
        "--resource-id",
        "a",
        "--after",
        str(mine["next_after"]),
    )
    assert none["events"] == []


@pytest.mark.parametrize(
    "args",
    [
        ["--resource-type", "deploy"],
        ["--resource-id", "a"],
        ["--resource-type", "", "--resource-id", "a"],
        ["--resource-type", "deploy", "--resource-id", "x" * 257],
        ["--resource-type", "deploy", "--resource-id", "a\tb"],
        ["--subject", ""],
        ["--subject", "s" * 257],
        ["--follow", "--resource-type", "deploy"],
    ],
    ids=[
        "type-alone",
        "id-alone",
        "type-empty",
        "id-too-long",
        "id-control",
        "subject-empty",
        "subject-too-long",
        "follow-type-alone",
    ],
)
def test_events_tail_rejects_a_bad_filter(cli: Cli, args: list[str]) -> None:
    """Only one of --resource-type/--resource-id, or a bad id, is VALIDATION_ERROR (exit
    2), also with --follow (checked before polling)."""
    run = cli("events", "tail", *args)
    assert run.code == 2
    assert run.json["error"]["code"] == "VALIDATION_ERROR"


# ----------------------------------------------------------------------------- db, audit


def test_db_current_then_upgrade(cli: Cli) -> None:
    """A fresh ledger has no revision; db upgrade brings it to head; a second is no_change."""
    before = cli.ok("db", "current")["info"]
    assert before["revision"] is None
    assert before["up_to_date"] is False
    up = cli.ok("db", "upgrade")
    assert up["info"]["revision"] == up["info"]["head"]
    assert up["status"] == "ok"
    assert cli.ok("db", "upgrade")["status"] == "no_change"
    after = cli.ok("db", "current")["info"]
    assert after["up_to_date"] is True
    assert cli("db", "current", fmt="table").code == 0


def test_db_current_hides_the_password(pg_cli: Cli) -> None:
    """db current on PostgreSQL never prints the URL's password."""
    url = pg_cli.ledger_url.replace("postgres@", "postgres:s3cret@")
    run = Cli(url, pg_cli.org)("db", "current")
    assert "s3cret" not in run.text


def test_audit_of_a_clean_ledger_exits_0(cli: Cli) -> None:
    """audit of a ledger with a normal lease history reports no violation."""
    lease = cli.ok(
        "lease", "acquire", "deploy", "a", "--ttl-seconds", "60", "--idempotency-key", "k"
    )["lease"]
    cli.ok("lease", "renew", "--lease-id", lease["lease_id"], "--execution-key", "k")
    cli.ok("lease", "release", "--lease-id", lease["lease_id"], "--execution-key", "k")
    report = cli.ok("audit")["audit"]
    assert report["violations"] == []
    assert (report["org"], report["generations"], report["transitions"]) == (cli.org, 1, 3)
    assert cli("audit", fmt="table").code == 0


def test_audit_prints_violations_and_exits_1(cli: Cli, sqlite_ledger: str) -> None:
    """A corrupted history (a renewal skipping versions) is reported; exit 1."""
    lease = cli.ok(
        "lease", "acquire", "deploy", "a", "--ttl-seconds", "60", "--idempotency-key", "k"
    )["lease"]
    cli.ok("lease", "renew", "--lease-id", lease["lease_id"], "--execution-key", "k")
    path = sqlite_ledger.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        db.execute("UPDATE baton_lease_transitions SET version = 7 WHERE action = 'renew'")
    run = cli("audit")
    assert run.code == 1
    receipt = run.json
    assert receipt["ok"] is False
    assert receipt["error"]["code"] == "AUDIT_VIOLATIONS"
    assert any("version 7" in v for v in receipt["audit"]["violations"])
    table = cli("audit", fmt="table")
    assert table.code == 1
    assert "VIOLATION" in table.stdout
    assert "Traceback" not in table.text


# ----------------------------------------------------------------------------- demo


def test_demo_forwards_its_options_and_exit_code(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """`baton demo` forwards its arguments and a global --ledger-url/--format to demo.main."""
    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 3

    monkeypatch.setitem(sys.modules, "prefect_baton.demo", types.SimpleNamespace(main=fake_main))
    argv = [
        "demo",
        "--workers",
        "3",
        "--input",
        "/src",
        "--crash",
        "1",
        "--pause",
        "1",
        "--ttl",
        "10",
        "--format",
        "json",
        "--keep",
        "--help",
    ]
    result = CliRunner().invoke(app, argv, env=CLEAN_ENV)
    assert result.exit_code == 3
    assert seen == [argv[1:]]
    root = ["--ledger-url", cli.ledger_url, "--format", "json", "demo", "--workers", "2"]
    result = CliRunner().invoke(app, root, env=CLEAN_ENV)
    assert seen[-1] == ["--ledger-url", cli.ledger_url, "--format", "json", "--workers", "2"]
    result = CliRunner().invoke(app, [*root, "--format", "table"], env=CLEAN_ENV)
    assert seen[-1] == ["--ledger-url", cli.ledger_url, "--workers", "2", "--format", "table"]
    redis = ["--redis-url", "redis://127.0.0.1:1/0", "demo"]
    result = CliRunner().invoke(app, redis, env=CLEAN_ENV)
    assert seen[-1] == ["--redis-url", "redis://127.0.0.1:1/0"]
    result = CliRunner().invoke(app, [*redis, "--redis", "redis://x"], env=CLEAN_ENV)
    assert seen[-1] == ["--redis", "redis://x"]


def test_demo_reports_a_missing_module_readably(monkeypatch: pytest.MonkeyPatch) -> None:
    """If prefect_baton.demo cannot be imported, `baton demo` exits 1 with one line."""
    monkeypatch.setitem(sys.modules, "prefect_baton.demo", None)
    result = CliRunner().invoke(app, ["demo"], env=CLEAN_ENV)
    assert result.exit_code == 1
    assert "not available" in result.stderr
    assert "Traceback" not in result.output


def test_sqlite_ledger_file_is_created_under_tmp(cli: Cli, sqlite_ledger: str) -> None:
    """Commands create the SQLite ledger file at the given path."""
    cli.ok("lease", "list")
    assert Path(sqlite_ledger.removeprefix("sqlite:///")).exists()


def test_global_options_may_follow_the_command(cli: Cli) -> None:
    """`--format json` and `--principal` after the command work as in the seed CLI style."""
    result = CliRunner().invoke(
        app,
        [
            "lease",
            "acquire",
            "deploy",
            "svc",
            "--ttl-seconds",
            "60",
            "--ledger-url",
            cli.ledger_url,
            "--org",
            cli.org,
            "--principal",
            "bob",
            "--format=json",
        ],
        env=CLEAN_ENV,
    )
    assert result.exit_code == 0, result.output
    receipt = json.loads(result.stdout)
    assert receipt["lease"]["owner"] == "bob"
    audit = cli.ok("audit", "--org", cli.org)
    assert audit["audit"]["org"] == cli.org


def test_hoisting_leaves_demo_arguments_and_double_dash_alone() -> None:
    """Global options are moved before the command, except for demo and after `--`."""
    assert hoist_global_options(["--org", "o", "lease", "list", "--format", "json"]) == [
        "--org",
        "o",
        "--format",
        "json",
        "lease",
        "list",
    ]
    demo_args = ["demo", "--format", "json", "--ledger-url", "x"]
    assert hoist_global_options(demo_args) == demo_args
    tail = ["checkpoint", "save", "s", "k", "--", "--format"]
    assert hoist_global_options(tail) == tail


def test_the_cli_on_the_embedded_ledger_loads_no_redis_or_postgres_driver() -> None:
    """``baton`` starts without importing redis-py or psycopg (about 200 modules, most of a
    second of every command's start on this machine); ``baton reconcile`` loads them when it
    runs."""
    code = (
        "import sys, prefect_baton.cli\n"
        "print(sorted(m for m in ('redis', 'psycopg') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ("lease", "inspect", "deploy", "svc"),
        ("lease", "list"),
        ("lease", "show", "lease_x"),
        ("checkpoint", "get", "subject", "kind"),
        ("checkpoint", "history", "subject", "kind"),
        ("handoff", "inbox"),
        ("handoff", "show", "hoff_x"),
        ("outcome", "list"),
        ("events", "tail"),
        ("audit",),
        ("timeline", "deploy", "svc", "--out", "t.svg"),
        ("db", "current"),
        ("keys", "list"),
    ],
)
def test_a_read_of_a_missing_sqlite_ledger_is_not_found_and_creates_nothing(
    argv: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command that only reads, given a SQLite ledger file that does not exist (a
    mistyped path), is NOT_FOUND naming the path and the remedy, and creates no file: it
    does not answer from a new empty ledger ("not held" for a resource someone holds)."""
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "typo.db"
    run = CliRunner().invoke(
        app, ["--ledger-url", f"sqlite:///{missing}", "--format", "json", *argv], env=CLEAN_ENV
    )
    error = json.loads(run.stdout)["error"]
    assert error["code"] == "NOT_FOUND", run.stdout
    assert str(missing) in error["message"]
    assert "--ledger-url" in error["message"]
    assert run.exit_code != 0
    assert list(tmp_path.iterdir()) == []


def test_a_command_declared_reads_only_refuses_a_missing_sqlite_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reads_only=True`` where a command is declared is all a new read command needs: on a
    SQLite ledger file that does not exist it is NOT_FOUND and creates nothing, while the
    same command declared without it creates and reads the ledger."""
    group = typer.Typer()

    @command(group, "probe.read", "leases", reads_only=True)
    def read(ctx: typer.Context) -> dict[str, str]:
        return {"org": ctx.obj.client().org}

    @command(group, "probe.write", "leases")
    def write(ctx: typer.Context) -> dict[str, str]:
        return {"org": ctx.obj.client().org}

    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "typo.db"
    root = typer.Typer()
    root.add_typer(group, name="probe")

    @root.callback()
    def main(ctx: typer.Context) -> None:
        ctx.obj = CliState(ledger_url=f"sqlite:///{missing}", org="o", principal="p")

    runner = CliRunner()
    run = runner.invoke(root, ["probe", "read"], env=CLEAN_ENV)
    assert run.exit_code == 5, run.stdout
    assert f"no ledger at {missing}" in run.output
    assert list(tmp_path.iterdir()) == []
    run = runner.invoke(root, ["probe", "write"], env=CLEAN_ENV)
    assert run.exit_code == 0, run.stdout
    assert missing.exists()
