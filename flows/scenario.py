"""The canonical four-role scenario as four Prefect flows handing off by deployment.

researcher -> writer -> operator -> reviewer on real input; the flows live in
:mod:`prefect_baton.prefect.scenario` (deployment entrypoints may name this file too:
``flows/scenario.py:researcher``, ``:writer``, ``:operator``, ``:reviewer``).

``python flows/scenario.py [--input DIR ...] [--workers N] [--out-dir DIR]`` serves the four
deployments from this process (on ``PREFECT_API_URL``, or Prefect's embedded server started
for the run), starts the researcher and prints each role's result as JSON.
"""

from __future__ import annotations

import argparse
import json
import os

# Prefect's temporary server must not send telemetry off this machine (set before
# Prefect is imported; an explicit setting wins).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect_baton.prefect.scenario import (
    OPERATOR,
    RESEARCHER,
    REVIEWER,
    WRITER,
    operator,
    researcher,
    reviewer,
    run_scenario,
    writer,
)

__all__ = [
    "OPERATOR",
    "RESEARCHER",
    "REVIEWER",
    "WRITER",
    "main",
    "operator",
    "researcher",
    "reviewer",
    "writer",
]


def main(inputs: list[str] | None = None, workers: int = 2, out_dir: str | None = None) -> dict:
    """Run the scenario (see :func:`prefect_baton.prefect.scenario.run_scenario`)."""
    return run_scenario(inputs, workers, out_dir)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", action="append", help="directory of .py files (repeatable)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out-dir")
    a = p.parse_args()
    print(json.dumps(main(a.input, a.workers, a.out_dir), indent=2, default=str))
