"""``examples/prefect_fencing.py``: a Prefect task under ``@leased`` writes to the user's
own table through the fencing guard; the earlier run's late write is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.prefect.conftest import REPO


def test_fencing_example_refuses_the_late_write(
    baton_env: dict[str, str], prefect_api: str, tmp_path: Path
) -> None:
    """Two task runs deploy; the first run's write after the second's is STALE_FENCE."""
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_api,
        "APP_DATABASE_URL": f"sqlite:///{tmp_path / 'app.db'}",
    }
    proc = subprocess.run(
        [sys.executable, "examples/prefect_fencing.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    first, second = out["epochs"]
    assert second > first
    assert out["late_write"] == "STALE_FENCE"
    assert out["deployed"] == {"version": "1.4.2", "epoch": second}
