"""The examples in ``examples/`` run from the repository root and print what they promise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run an example from the repository root on a ledger under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["BATON_LEDGER_URL"] = f"sqlite:///{tmp_path / 'ledger.db'}"
    env["TMPDIR"] = str(tmp_path)
    return subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_lease_block(tmp_path: Path) -> None:
    """lease_block.py crashes half-way, resumes from its checkpoint, and finishes once."""
    proc = run([sys.executable, "examples/lease_block.py"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "digest-agent: crashed before charlie" in out
    assert "digest-agent: holds epoch 2, resuming after 2 item(s)" in out
    assert "other-agent: CONFLICT, the batch is taken" in out
    processed = re.findall(r"^digest-agent: processed (\w+)$", out, flags=re.M)
    assert processed == ["alpha", "bravo", "charlie", "delta", "echo"]
    assert "outcome succeeded with 5 evidence items" in out
    assert "after the run: held=False, epoch=2" in out


def test_checkpoint_cas(tmp_path: Path) -> None:
    """checkpoint_cas.py: each round one writer wins, the other retries; no update is lost."""
    proc = run([sys.executable, "examples/checkpoint_cas.py"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rounds = re.findall(
        r"^round (\d+): writer-(\w) won at version (\d+); writer-(\w) got VERSION_CONFLICT",
        proc.stdout,
        flags=re.M,
    )
    assert [int(r[0]) for r in rounds] == [1, 2, 3, 4, 5]
    for _, winner, version, loser in rounds:
        assert winner != loser
        assert int(version) % 2 == 1
    assert "final version 10, 10 entries, 10 versions kept" in proc.stdout
    assert "no update was lost (10 entries)" in proc.stdout


def test_cli_two_processes(tmp_path: Path) -> None:
    """cli_two_processes.sh: two shell workers using only `baton` do each job exactly once."""
    proc = run(["bash", "examples/cli_two_processes.sh"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for job in ("job-1", "job-2", "job-3", "job-4"):
        assert f"{job}: done 1 time(s), 1 outcome(s)" in proc.stdout
    workers = set(re.findall(r"^(worker-\w): working on", proc.stdout, flags=re.M))
    assert workers <= {"worker-a", "worker-b"}
    assert proc.stdout.rstrip().endswith("every job was done exactly once")


def _prefect_entry_points() -> list[Path]:
    """Every example and flow that imports Prefect (``prefect`` or ``prefect_baton.prefect``)."""
    files = sorted(EXAMPLES.glob("*.py")) + sorted((ROOT / "flows").glob("*.py"))
    return [
        p for p in files if re.search(r"^from prefect(_baton\.prefect)?[ .]", p.read_text(), re.M)
    ]


def test_prefect_entry_points_turn_server_telemetry_off_before_importing_prefect() -> None:
    """Each Prefect example and flow sets PREFECT_SERVER_ANALYTICS_ENABLED=false (keeping an
    explicit setting) before its first Prefect import, so a temporary server it starts sends
    no telemetry off the machine."""
    line = 'os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")'
    entry_points = _prefect_entry_points()
    assert len(entry_points) >= 10
    for path in entry_points:
        text = path.read_text()
        first_import = re.search(r"^from prefect(_baton\.prefect)?[ .]", text, re.M)
        assert first_import is not None
        assert line in text[: first_import.start()], path.name
