"""The canonical four-role scenario as four Prefect flows handing off by deployment.

researcher -> writer -> operator -> reviewer, on real input (``.py`` files of the running
Python's ``json``, ``email`` and ``http`` packages by default). The role logic is
``prefect_baton.demo.roles`` (the same functions ``baton demo`` runs as OS processes); here
each role is a flow with a deployment, and each hands the work to the next role's deployment:

- ``baton-researcher``: researcher workers run as concurrent tasks, each leasing and
  analysing files with fenced checkpoints and outcomes; then ``handoff_to`` the writer's
  deployment;
- ``baton-writer``: ``accept_handoff``, compile the report (role function: it hands off to
  the operator principal), start the operator's deployment for that handoff;
- ``baton-operator``: deliver the report (role function: accepts, leases ``delivery``, hands
  off to the reviewer principal), start the reviewer's deployment;
- ``baton-reviewer``: recompute every file's sha256 against the evidence; the verdict.

``python flows/scenario.py [--input DIR ...] [--workers N]`` serves the four deployments from
this process (on ``PREFECT_API_URL``, or Prefect's embedded server started for the run),
starts the researcher and prints each role's result as JSON. The ledger is
``BATON_LEDGER_URL`` (default ``./.baton/ledger.db``), the org ``BATON_ORG``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.deployments import run_deployment

from prefect_baton import Baton
from prefect_baton.demo import analysis, roles
from prefect_baton.prefect import (
    accept_handoff,
    handoff_to,
    prefect_api,
    serving,
    start_recipient,
    wait_for_run,
)

RESEARCHER = "baton-researcher/researcher"
WRITER = "baton-writer/writer"
OPERATOR = "baton-operator/operator"
REVIEWER = "baton-reviewer/reviewer"


def _files(inputs: list[str] | None) -> dict[str, Path]:
    dirs = [Path(p) for p in inputs] if inputs else analysis.default_inputs()
    return analysis.list_files(dirs)


def _as(principal: str) -> Baton:
    return Baton.from_settings(principal=principal)


@task
def research(inputs: list[str] | None, worker: str, offset: int) -> dict[str, Any]:
    """One researcher worker over every file (leases each file it works on)."""
    stats = roles.researcher(_as("researcher"), _files(inputs), worker=worker, offset=offset)
    return stats.to_dict()


@flow(name="baton-researcher", persist_result=True)
def researcher(
    inputs: list[str] | None = None, out_dir: str = ".baton/scenario", workers: int = 2
) -> dict[str, Any]:
    """Analyse every file with ``workers`` concurrent workers, then hand off to the writer."""
    files = _files(inputs)
    futures = [research.submit(inputs, f"w{i}", i * 7) for i in range(max(1, workers))]
    stats = [f.result() for f in futures]
    sent = handoff_to(
        "writer",
        "research",
        message=f"{len(files)} files analysed; compile the report.",
        deployment=WRITER,
        parameters={"inputs": inputs, "out_dir": out_dir},
        baton=_as("researcher"),
    )
    return {"workers": stats, "handoff_id": sent.handoff_id, "next": _run_id(sent.flow_run)}


@flow(name="baton-writer", persist_result=True)
def writer(
    handoff_id: str | None = None, inputs: list[str] | None = None, out_dir: str = ".baton"
) -> dict[str, Any]:
    """Accept the researcher's handoff, compile the report, start the operator."""
    b = _as("writer")
    if handoff_id is None:
        return {"status": "no handoff_id"}
    with accept_handoff(handoff_id, baton=b):
        h = roles.writer(b, _files(inputs), to_principal="operator")
    run = start_recipient(h.handoff_id, OPERATOR, {"inputs": inputs, "out_dir": out_dir})
    return {"handoff_id": h.handoff_id, "next": _run_id(run)}


@flow(name="baton-operator", persist_result=True)
def operator(
    handoff_id: str | None = None, inputs: list[str] | None = None, out_dir: str = ".baton"
) -> dict[str, Any]:
    """Deliver the report (the role accepts the writer's handoff), start the reviewer."""
    path = roles.operator(_as("operator"), Path(out_dir), to_principal="reviewer")
    pending = [h for h in _as("reviewer").handoffs.inbox() if h.subject_id == roles.REPORT]
    run = start_recipient(pending[-1].handoff_id, REVIEWER, {"inputs": inputs}) if pending else None
    return {"report": str(path), "next": _run_id(run)}


@flow(name="baton-reviewer", persist_result=True)
def reviewer(handoff_id: str | None = None, inputs: list[str] | None = None) -> dict[str, Any]:
    """Check every file's sha256 against the evidence and record the verdict."""
    return roles.reviewer(_as("reviewer"), _files(inputs))


def _run_id(run: Any) -> str | None:
    return str(run.id) if run is not None else None


def main(inputs: list[str] | None = None, workers: int = 2, out_dir: str | None = None) -> Any:
    """Serve the four deployments, run the chain, return each role's result."""
    out = out_dir or str(Path(".baton/scenario").resolve())
    deployments = [
        researcher.to_deployment(name="researcher"),
        writer.to_deployment(name="writer"),
        operator.to_deployment(name="operator"),
        reviewer.to_deployment(name="reviewer"),
    ]
    results: dict[str, Any] = {}
    with prefect_api(), serving(*deployments):
        run = run_deployment(
            RESEARCHER,
            parameters={"inputs": inputs, "out_dir": out, "workers": workers},
            timeout=0,
        )
        for role in ("researcher", "writer", "operator", "reviewer"):
            done = wait_for_run(run.id, timeout_seconds=600)
            results[role] = done.state.result() if done.state.is_completed() else done.state.name
            nxt = results[role].get("next") if isinstance(results[role], dict) else None
            if nxt is None:
                break
            run = done.model_copy(update={"id": nxt})
    return results


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", action="append", help="directory of .py files (repeatable)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out-dir")
    a = p.parse_args()
    print(json.dumps(main(a.input, a.workers, a.out_dir), indent=2, default=str))
