"""``baton`` as real OS processes (the console script and ``python -m prefect_baton.cli``),
on SQLite and PostgreSQL, including a race between two processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import BATON_SCRIPT, Cli, process_env, run_process


def test_console_script_runs_a_lease_lifecycle(cli: Cli) -> None:
    """The installed `baton` script acquires, renews and releases with JSON receipts."""
    if not BATON_SCRIPT.exists():
        pytest.skip("console script not installed next to the interpreter")
    base = [str(BATON_SCRIPT), *cli.argv((), "alice", "agent", "json")]
    acquired = run_process(
        [
            *base,
            "lease",
            "acquire",
            "deploy",
            "svc",
            "--ttl-seconds",
            "60",
            "--idempotency-key",
            "run-1",
        ]
    )
    assert acquired.code == 0, acquired.text
    lease_id = acquired.json["lease"]["lease_id"]
    proof = ["--lease-id", lease_id, "--execution-key", "run-1"]
    renewed = run_process([*base, "lease", "renew", *proof, "--expected-version", "1"])
    assert renewed.code == 0, renewed.text
    assert renewed.json["lease"]["version"] == 2
    released = run_process([*base, "lease", "release", *proof])
    assert released.json["receipt"]["status"] == "released"


def test_module_entry_point_reports_errors_with_exit_codes(cli: Cli) -> None:
    """`python -m prefect_baton.cli` exits 3 on conflict and 5 on not found, JSON on stdout."""
    assert cli.proc("lease", "acquire", "deploy", "svc", "--ttl-seconds", "60").code == 0
    conflict = cli.proc("lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", principal="bob")
    assert conflict.code == 3
    assert conflict.json["error"]["code"] == "CONFLICT"
    missing = cli.proc("handoff", "show", "handoff_nope")
    assert missing.code == 5
    assert missing.json["error"]["code"] == "NOT_FOUND"


def test_checkpoint_state_from_stdin_in_a_process(cli: Cli) -> None:
    """A piped JSON object is the checkpoint state when STATE is '-'."""
    run = cli.proc("checkpoint", "save", "doc-1", "progress", "-", input='{"piped": true}')
    assert run.code == 0, run.text
    assert run.json["checkpoint"]["state"] == {"piped": True}


def test_bad_arguments_in_a_process_print_no_traceback(cli: Cli) -> None:
    """Missing option, malformed JSON state and negative TTL exit 2 with one readable line."""
    cases = [
        (("lease", "acquire", "deploy", "svc"), "Missing option '--ttl-seconds'"),
        (("checkpoint", "save", "doc", "k", "{nope"), "not valid JSON"),
        (("lease", "acquire", "deploy", "svc", "--ttl-seconds", "-5"), "from 10 to 86400"),
    ]
    for args, needle in cases:
        run = cli.proc(*args, fmt="table")
        assert run.code == 2, (args, run.text)
        assert needle in run.stderr
        assert run.stderr.strip().count("\n") == 0
        assert "Traceback" not in run.text


def test_unavailable_ledger_in_a_process_exits_11(cli: Cli) -> None:
    """An unreachable PostgreSQL ledger exits 11 with one line on stderr."""
    down = Cli("postgresql://nobody@127.0.0.1:1/none", cli.org)
    run = down.proc("lease", "list", fmt="table")
    assert run.code == 11
    assert "UNAVAILABLE" in run.stderr
    assert "Traceback" not in run.text


def test_events_tail_follow_streams_lines_and_stops_on_ctrl_c(cli: Cli) -> None:
    """--follow prints existing and new events as JSON lines; SIGINT ends it with exit 0."""
    cli.ok("lease", "acquire", "deploy", "a", "--ttl-seconds", "60")
    argv = [
        sys.executable,
        "-m",
        "prefect_baton.cli",
        *cli.argv(("events", "tail", "--follow", "--interval", "0.05"), "alice", "agent", "json"),
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=process_env()
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["kind"] == "lease.acquired"
        cli.ok("checkpoint", "save", "doc", "progress", '{"n": 1}')
        second = json.loads(proc.stdout.readline())
        assert second["kind"] == "checkpoint.saved"
        assert second["seq"] > first["seq"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert "Traceback" not in err


@pytest.mark.slow
def test_demo_runs_for_real_with_forwarded_options(tmp_path: Path) -> None:
    """`baton --format json demo --workers 1 --input DIR` runs the scenario and exits 0."""
    src = tmp_path / "input"
    src.mkdir()
    (src / "a.py").write_text("def f():\n    return 1\n", encoding="utf-8")
    (src / "b.py").write_text("class C:\n    pass\n", encoding="utf-8")
    run = run_process(
        [
            sys.executable,
            "-m",
            "prefect_baton.cli",
            "--format",
            "json",
            "demo",
            "--workers",
            "1",
            "--input",
            str(src),
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert run.code == 0, run.text
    summary = run.json
    assert summary["ok"] is True
    assert summary["verdict"] == "accepted"


def race(cli: Cli) -> list[int]:
    """Two processes acquire the same resource at once; returns their exit codes."""
    assert cli.proc("db", "upgrade").code == 0
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "prefect_baton.cli",
                *cli.argv(
                    (
                        "lease",
                        "acquire",
                        "deploy",
                        "contested",
                        "--ttl-seconds",
                        "60",
                        "--idempotency-key",
                        f"run-{who}",
                    ),
                    who,
                    "agent",
                    "json",
                ),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=process_env(),
        )
        for who in ("alice", "bob")
    ]
    codes = []
    for p in procs:
        p.communicate(timeout=300)
        codes.append(p.returncode)
    return codes


def test_two_processes_race_for_one_resource_on_sqlite(cli: Cli) -> None:
    """Of two concurrent `baton lease acquire` processes exactly one exits 0, the other 3."""
    assert sorted(race(cli)) == [0, 3]
    held = cli.ok("lease", "list", "--owner", "*", role="admin")["leases"]
    assert len(held) == 1


def test_two_processes_race_for_one_resource_on_postgres(pg_cli: Cli) -> None:
    """On PostgreSQL too, exactly one of two racing acquires exits 0 and the other 3."""
    assert sorted(race(pg_cli)) == [0, 3]
    held = pg_cli.ok("lease", "list", "--owner", "*", role="admin")["leases"]
    assert len(held) == 1
