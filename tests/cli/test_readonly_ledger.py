"""A SQLite ledger this process may read but not write (a read-only file, or a read-only
directory, where SQLite keeps the ``-wal`` and ``-shm`` files): a write is UNAVAILABLE (exit
11) with a message naming the file and saying it is not writable, not the bare driver text;
a read of a read-only file still works.

Root ignores file permissions (``CAP_DAC_OVERRIDE``), so as root the commands run under
``setpriv`` without that capability: still uid 0, the owner of the files, now held to
their permission bits, as any other user is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import process_env

_CAPS = "-dac_override,-dac_read_search"


def _prefix() -> list[str]:
    """The command prefix that holds this user to file permissions (none when not root)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv: file permissions cannot be made to apply")
    return [setpriv, "--bounding-set", _CAPS, "--inh-caps", _CAPS]


def _baton(ledger: Path, *args: str) -> tuple[int, dict[str, object]]:
    argv = [sys.executable, "-m", "prefect_baton.cli", "--ledger-url", f"sqlite:///{ledger}"]
    argv += ["--org", "o", "--principal", "p", "--format", "json", *args]
    done = subprocess.run(
        [*_prefix(), *argv], capture_output=True, text=True, env=process_env(), timeout=300
    )
    return done.returncode, json.loads(done.stdout)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Path]:
    """A SQLite ledger holding one lease, in a folder of its own; permissions restored
    afterwards."""
    folder = tmp_path / "ledger"
    folder.mkdir()
    path = folder / "ledger.db"
    code, out = _baton(path, "lease", "acquire", "deploy", "svc", "--ttl-seconds", "600")
    assert code == 0, out
    probe = folder / "probe"
    probe.write_text("")
    probe.chmod(0o444)
    held = subprocess.run([*_prefix(), sys.executable, "-c", f"open({str(probe)!r}, 'a')"])
    probe.unlink()
    if held.returncode == 0:
        pytest.skip("file permissions do not apply to this process")
    yield path
    folder.chmod(0o755)
    for f in folder.iterdir():
        f.chmod(0o644)


def _refused_write(path: Path) -> None:
    code, out = _baton(path, "lease", "acquire", "deploy", "other", "--ttl-seconds", "600")
    assert code == 11, out
    error = out["error"]
    assert isinstance(error, dict)
    assert error["code"] == "UNAVAILABLE"
    assert f"the SQLite ledger file {path} is not writable" in error["message"]


def test_a_read_only_ledger_file_refuses_writes_by_name_and_still_reads(ledger: Path) -> None:
    ledger.chmod(0o444)
    _refused_write(ledger)
    code, out = _baton(ledger, "lease", "list")
    assert code == 0, out
    leases = out["leases"]
    assert isinstance(leases, list)
    assert [lease["resource_id"] for lease in leases] == ["svc"]


def test_a_ledger_in_a_read_only_directory_is_refused_by_name(ledger: Path) -> None:
    """SQLite keeps the -wal and -shm files beside the ledger: in a read-only directory it
    cannot be written, nor read in WAL mode; both name the file."""
    ledger.parent.chmod(0o555)
    _refused_write(ledger)
    code, out = _baton(ledger, "lease", "list")
    assert code == 11, out
    error = out["error"]
    assert isinstance(error, dict)
    assert "not writable" in error["message"]
