"""Hostile command-line input gets VALIDATION_ERROR (exit 2), never INTERNAL_ERROR."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


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
