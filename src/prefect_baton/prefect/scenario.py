"""The canonical four-role scenario as four Prefect flows handing off by deployment: see
:mod:`prefect_baton.demo.scenario`, where it lives with the role logic it runs (so
``prefect_baton.demo`` reaches it without an import cycle); this module keeps its names
importable from here."""

from __future__ import annotations

from prefect_baton.demo.scenario import (
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
    "operator",
    "researcher",
    "reviewer",
    "run_scenario",
    "writer",
]
