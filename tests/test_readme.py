"""The README's Python example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(tmp_path: Path) -> None:
    """Every ```python block of the README runs without error in a fresh directory."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has a Python example"
    for i, code in enumerate(blocks):
        script = tmp_path / f"block{i}.py"
        script.write_text(code)
        proc = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        assert "CONFLICT" in proc.stdout
        assert "STALE_FENCE" in proc.stdout
        assert "released" in proc.stdout


def test_readme_names_the_two_setup_commands() -> None:
    """The README's set-up shows exactly `make demo` and `make test`."""
    text = README.read_text()
    setup = text.split("## Set-up", 1)[1].split("##", 1)[0]
    commands = re.findall(r"^make \w+", setup, flags=re.M)
    assert commands == ["make demo", "make test"]


def test_readme_counts_the_demos_accepted_handoffs_for_both_engines() -> None:
    """The README's count of the demo's "handoffs accepted" holds for both engines: the
    files plus two, and plus three with ``--engine prefect`` (tests/demo/test_demo.py)."""
    text = " ".join(README.read_text().split())
    said = text.split('"handoffs accepted" counts', 1)[1][:300]
    assert said.startswith(" the files plus two")
    assert "with `--engine prefect` plus three" in said
