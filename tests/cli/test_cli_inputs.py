"""Hostile command-line input gets VALIDATION_ERROR (exit 2), never INTERNAL_ERROR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Annotated, Any

import pytest
from typer.models import ParameterInfo

from prefect_baton.cli import app

from .conftest import CLEAN_ENV, Cli, Run


def _baton(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    ledger = f"sqlite:///{tmp_path / 'l.db'}"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect_baton.cli",
            "--ledger-url",
            ledger,
            "--format",
            "json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_deeply_nested_state_file_is_a_validation_error(tmp_path: Path) -> None:
    """A state file nested 100,000 levels deep is VALIDATION_ERROR, not a RecursionError."""
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' + "[" * 100_000 + "]" * 100_000 + "}")
    proc = _baton(tmp_path, "checkpoint", "save", "s", "k", str(deep))
    assert proc.returncode == 2, proc.stdout
    assert json.loads(proc.stdout)["error"]["code"] == "VALIDATION_ERROR"
    assert "Traceback" not in proc.stderr


def test_a_5000_digit_integer_in_state_is_a_validation_error(tmp_path: Path) -> None:
    """A state holding a 5,000-digit integer (over Python's int-str conversion limit) is
    VALIDATION_ERROR exit 2, inline or from a file, as the Python API and REST say."""
    text = '{"n": ' + "9" * 5000 + "}"
    big = tmp_path / "big.json"
    big.write_text(text)
    for source in (text, str(big)):
        proc = _baton(tmp_path, "checkpoint", "save", "s", "k", source)
        assert proc.returncode == 2, proc.stdout
        assert json.loads(proc.stdout)["error"]["code"] == "VALIDATION_ERROR"


def test_undecodable_argument_bytes_are_a_validation_error(tmp_path: Path) -> None:
    """An argument with bytes that are not UTF-8 is VALIDATION_ERROR (exit 2)."""
    ledger = f"sqlite:///{tmp_path / 'l.db'}"
    proc = subprocess.run(
        [
            sys.executable.encode(),
            b"-m",
            b"prefect_baton.cli",
            b"--ledger-url",
            ledger.encode(),
            b"--format",
            b"json",
            b"lease",
            b"acquire",
            b"t",
            b"\xff",
            b"--ttl-seconds",
            b"10",
        ],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout
    assert json.loads(proc.stdout)["error"]["code"] == "VALIDATION_ERROR"


def _error(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    err: dict[str, Any] = json.loads(proc.stdout)["error"]
    assert err["code"] == "VALIDATION_ERROR"
    return err


def test_an_endless_state_file_or_stdin_is_refused_unread(tmp_path: Path) -> None:
    """``/dev/zero`` as the state file, and an endless stdin, are VALIDATION_ERROR naming
    the state cap (1 MiB by default, BATON_STATE_MAX_BYTES): the CLI stops reading past the
    read limit (the REST body limit of that cap) instead of running out of memory."""
    err = _error(_baton(tmp_path, "checkpoint", "save", "s", "k", "/dev/zero"))
    assert err["message"] == (
        "state file '/dev/zero' is over 3211264 bytes; a state is at most 1048576 bytes of "
        "JSON (BATON_STATE_MAX_BYTES)"
    )
    ledger = f"sqlite:///{tmp_path / 'l.db'}"
    with open("/dev/zero", "rb") as endless:
        proc = subprocess.run(
            [sys.executable, "-m", "prefect_baton.cli", "--ledger-url", ledger, "--format",
             "json", "checkpoint", "save", "s", "k", "-"],
            stdin=endless, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert "state on stdin is over 3211264 bytes" in _error(proc)["message"]


def test_a_huge_state_file_is_refused_by_its_first_bytes(tmp_path: Path) -> None:
    """A 300 MB (sparse) state file is refused like a small one over the limit, and the
    limit follows BATON_STATE_MAX_BYTES (never below the 2 MiB body floor)."""
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(300 * 1024 * 1024)
    err = _error(_baton(tmp_path, "checkpoint", "save", "s", "k", str(huge)))
    assert "is over 3211264 bytes; a state is at most 1048576 bytes" in err["message"]
    ledger = f"sqlite:///{tmp_path / 'l.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "prefect_baton.cli", "--ledger-url", ledger, "--format",
         "json", "checkpoint", "save", "s", "k", str(huge)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "BATON_STATE_MAX_BYTES": "4096"},
    )  # fmt: skip
    assert "over 2097152 bytes; a state is at most 4096 bytes" in _error(proc)["message"]


def test_an_indented_state_within_the_cap_is_read_whole(tmp_path: Path) -> None:
    """The read limit is the body limit, not the cap: a state file whose spaces make it
    larger than the cap is saved when its canonical JSON is within the cap."""
    padded = tmp_path / "padded.json"
    padded.write_text('{"n":' + " " * (1024 * 1024 + 10) + "1}")
    proc = _baton(tmp_path, "checkpoint", "save", "s", "k", str(padded))
    assert proc.returncode == 0, proc.stdout
    assert json.loads(proc.stdout)["checkpoint"]["state"] == {"n": 1}


def _usage(run: Run) -> str:
    assert run.code == 2, run.text
    assert run.json["error"]["code"] == "VALIDATION_ERROR"
    message: str = run.json["error"]["message"]
    return message


def test_a_bad_poll_interval_is_a_validation_error(cli: Cli) -> None:
    """``--interval`` of ``events tail`` and ``reconcile`` must be a finite number of
    seconds within range: inf, nan, 1e12, a negative or too small one exits 2 with
    VALIDATION_ERROR before anything runs (never INTERNAL_ERROR after the first page)."""
    for value in ("inf", "nan", "1e12", "-1", "0", "0.01", "3601"):
        message = _usage(cli("events", "tail", "-f", "--interval", value))
        assert "--interval" in message, value
        assert "0.05 to 3600" in message, value
    assert "0.01 to 3600" in _usage(cli("reconcile", "--follow", "--interval", "inf"))


def test_a_timeline_out_path_that_cannot_be_written(cli: Cli, tmp_path: Path) -> None:
    """``timeline --out`` into a missing directory, under a file, at an existing directory
    (said to be one, whatever its name: not an "unsupported timeline file"), or where the
    system refuses the file is VALIDATION_ERROR naming the path and the reason; no directory
    is created."""
    missing = tmp_path / "no" / "such" / "t.svg"
    assert _usage(cli("timeline", "deploy", "svc", "-o", str(missing))) == (
        f"cannot write timeline file '{missing}': its directory '{missing.parent}' does not exist"
    )
    assert not (tmp_path / "no").exists()
    a_file = tmp_path / "f"
    a_file.write_text("")
    message = _usage(cli("timeline", "deploy", "svc", "-o", str(a_file / "t.svg")))
    assert message.endswith(f"its directory '{a_file}' is not a directory")
    cli.ok("lease", "acquire", "deploy", "svc", "--ttl-seconds", "60")
    for name in ("d.svg", "somedir"):  # an existing directory, with or without an extension
        a_dir = tmp_path / name
        a_dir.mkdir()
        message = _usage(cli("timeline", "deploy", "svc", "-o", str(a_dir)))
        assert message == (
            f"cannot write timeline file '{a_dir}': it is a directory; name a file in it, "
            f"e.g. '{a_dir / 'timeline.svg'}'"
        )
    written = cli.ok("timeline", "deploy", "svc", "-o", str(tmp_path / "t.svg"))
    assert written["timeline"]["path"] == str(tmp_path / "t.svg")


def test_ids_with_format_characters_are_a_validation_error(cli: Cli) -> None:
    """A resource id, subject or recipient holding an invisible format character (U+200B,
    U+FEFF, a tag character) exits 2 with VALIDATION_ERROR, as in Python and over REST;
    the table format's error line shows the character escaped, not invisibly."""
    for args in (
        ("lease", "acquire", "deploy", "svc\u200b", "--ttl-seconds", "60"),
        ("handoff", "create", "bob\ufeff", "doc-1"),
        ("outcome", "record", "doc\U000e0041", "failed"),
    ):
        message = _usage(cli(*args))
        assert "must not contain invisible format characters (Unicode category Cf)" in message
    shown = cli("lease", "acquire", "deploy", "svc\u200b", "--ttl-seconds", "60", fmt="table")
    assert shown.code == 2, shown.text
    assert "\u200b" not in shown.stderr
    assert "found U+200B" in shown.stderr
    assert cli("lease", "list").json["leases"] == []


@pytest.mark.parametrize(
    ("line", "option"),
    [
        ("lease acquire deploy svc --ttl-seconds 60.0", "--ttl-seconds"),
        ("lease acquire deploy svc --ttl-seconds 6e1", "--ttl-seconds"),
        ("lease acquire deploy svc --ttl-seconds 60 --expected-version 1.0", "--expected-version"),
        ("lease list --limit 5.0", "--limit"),
        ("outcome list --limit 5.5", "--limit"),
        ("serve --port 8080.0", "--port"),
    ],
)
def test_integer_options_refuse_non_integers(cli: Cli, line: str, option: str) -> None:
    """An integer option given a number with a fraction or exponent (``60.0``, ``6e1``) is a
    usage error (VALIDATION_ERROR, exit 2) naming the option, not rounded to an integer."""
    run = cli(*line.split())
    assert run.code == 2, run.text
    error = run.json["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert f"Invalid value for '{option}': must be an integer, got" in error["message"]


def test_integer_options_keep_their_range(cli: Cli) -> None:
    """A range declared on an integer option (``--port``: 1 to 65535) still holds."""
    run = cli("serve", "--port", "0")
    assert run.code == 2, run.text
    assert "must be an integer from 1 to 65535, got 0" in run.json["error"]["message"]
    assert (
        cli.ok("lease", "acquire", "deploy", "svc", "--ttl-seconds", "+60")["lease"]["ttl_seconds"]
        == 60
    )


def test_every_integer_option_of_baton_takes_the_integer_parser() -> None:
    """Every ``int`` argument and option of every ``baton`` command got the shared parser
    where the app is assembled, so a new integer option cannot be left lax."""
    from prefect_baton.cli import COMMANDS, SUB_APPS

    callbacks = [fn for _name, fn, _settings in COMMANDS]
    callbacks += [i.callback for _name, sub in SUB_APPS for i in sub.registered_commands]
    seen = 0
    for fn in callbacks:
        assert fn is not None
        for name, hint in typing.get_type_hints(fn, include_extras=True).items():
            if typing.get_origin(hint) is not Annotated:
                continue
            base, *meta = typing.get_args(hint)
            if base not in (int, int | None):
                continue
            infos = [m for m in meta if isinstance(m, ParameterInfo)]
            assert infos, (fn, name)
            assert all(i.parser is not None for i in infos), (fn, name)
            seen += 1
    assert seen >= 10


@pytest.mark.parametrize(
    ("line", "option", "value"),
    [
        (
            "lease acquire deploy svc --ttl-seconds 60 --execution-key --purpose",
            "--execution-key",
            "--purpose",
        ),
        ("lease acquire deploy svc --ttl-seconds 60 --purpose --scope", "--purpose", "--scope"),
        (
            "lease acquire deploy svc --ttl-seconds 60 --execution-key=--help",
            "--execution-key",
            "--help",
        ),
        ("handoff create bob doc-1 --message --lease-id", "--message", "--lease-id"),
        ("lease list --resource-type --all", "--resource-type", "--all"),
    ],
)
def test_an_option_name_given_as_a_value_is_refused(
    cli: Cli, line: str, option: str, value: str
) -> None:
    """An option whose value is another option's name (a value left out:
    ``--execution-key --purpose``) exits 2 with VALIDATION_ERROR naming both, and nothing is
    recorded (before, the lease was acquired under the execution key ``--purpose``)."""
    message = _usage(cli(*line.split()))
    assert message.startswith(f"{option} took {value!r} as its value"), message
    assert cli("lease", "list").json["leases"] == []
    assert cli("handoff", "list", role="owner").json["handoffs"] == []


def test_a_global_option_name_given_as_a_value_is_refused(cli: Cli) -> None:
    """The same for a global option given before the command (``--org --role lease list``)."""
    run = cli.runner.invoke(
        app,
        ["--ledger-url", cli.ledger_url, "--format", "json", "--org", "--role", "lease", "list"],
        env=CLEAN_ENV,
    )
    assert run.exit_code == 2, run.stdout
    assert "--org took '--role' as its value" in run.stdout + run.stderr


def test_json_naming_a_key_twice_is_refused(cli: Cli, tmp_path: Path) -> None:
    """A state or evidence item naming a key twice (inline, in a file, nested) exits 2 with
    VALIDATION_ERROR naming the key, as the REST API answers; before, the last value was
    stored silently. Nothing is recorded."""
    twice = tmp_path / "twice.json"
    twice.write_text('{"n": 1, "deep": {"k": 1, "k": 2}}')
    for args in (
        ("checkpoint", "save", "s", "k", '{"a": 1, "a": 2}'),
        ("checkpoint", "save", "s", "k", str(twice)),
        (
            "outcome",
            "record",
            "s",
            "failed",
            "--evidence",
            '{"kind": "log", "uri": "a", "uri": "b"}',
        ),
    ):
        message = _usage(cli(*args))
        assert "appears twice in one object" in message, message
    assert cli("checkpoint", "get", "s", "k").json["error"]["code"] == "NOT_FOUND"
    assert cli("outcome", "list", "s").json["outcomes"] == []


def test_a_global_option_without_its_value_after_the_command(cli: Cli) -> None:
    """``baton lease inspect t r --org`` (the value left out) says the option needs an
    argument, as before the command; before, click answered 'No such option: --org'."""
    for option in ("--org", "--principal", "--format"):
        message = _usage(cli("lease", "inspect", "deploy", "svc", option))
        assert message == f"Option '{option}' requires an argument.", message


def test_a_misspelt_evidence_key_is_refused_not_glued_to_a_value(cli: Cli) -> None:
    """``--evidence 'kind=file,uri=file:///x,digets=sha256:ab'`` exits 2 naming the unknown
    key; before, ``digets=...`` was stored as part of the URI (or of the kind, whichever came
    before it) with exit 0. A comma inside a value that is not followed by ``name=`` stays
    in the value, and nothing is recorded for a refused item."""
    for item in (
        "kind=file,uri=file:///x,digets=sha256:ab",
        "kind=file,digets=sha256:ab,uri=file:///x",
    ):
        message = _usage(cli("outcome", "record", "s", "succeeded", "--evidence", item))
        assert "got 'digets'" in message, message
    assert cli("outcome", "list", "s").json["outcomes"] == []
    recorded = cli(
        "outcome", "record", "s", "succeeded", "--evidence", "kind=file,uri=file:///a,b.txt"
    ).json
    assert recorded["outcome"]["evidence"][0]["uri"] == "file:///a,b.txt"


def test_an_evidence_kind_follows_the_id_rule(cli: Cli) -> None:
    """``--evidence`` with a ``kind`` holding a control character or white space at an end
    exits 2 with the Python API's message (the id rule of a checkpoint's ``kind``); before,
    it was recorded. Nothing is recorded."""
    for item, message in (
        ('{"kind": "fi\\u0001le", "uri": "u"}', "evidence kind must not contain control"),
        ("kind=fi\tle,uri=u", "evidence kind must not contain control"),
        ('{"kind": "file ", "uri": "u"}', "evidence kind must not start or end with white"),
    ):
        refused = _usage(cli("outcome", "record", "s", "failed", "--evidence", item))
        assert message in refused, refused
    assert cli("outcome", "list", "s").json["outcomes"] == []


def test_state_that_is_json_but_not_an_object_says_so(cli: Cli) -> None:
    """``baton checkpoint save s k '"str"'`` (valid JSON, a string) exits 2 saying the state
    must be a JSON object, as for a list; before, it said the text was neither JSON nor an
    existing file. A missing file is still named as one."""
    for text, kind in (('"str"', "str"), ("12", "int"), ("null", "NoneType")):
        message = _usage(cli("checkpoint", "save", "s", "k", text))
        assert message.endswith(f"state must be a JSON object, got {kind}"), message
    message = _usage(cli("checkpoint", "save", "s", "k", "no-such-file.json"))
    assert "neither JSON text nor an existing file" in message, message
    assert cli("checkpoint", "get", "s", "k").json["error"]["code"] == "NOT_FOUND"
