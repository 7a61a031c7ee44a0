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

:func:`run_scenario` serves the four deployments from this process (on ``PREFECT_API_URL``,
or Prefect's embedded server started for the run), starts the researcher and returns each
role's result; ``flows/scenario.py`` is the script around it. The ledger is
``BATON_LEDGER_URL`` (default ``./.baton/ledger.db``), the org ``BATON_ORG``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.deployments import run_deployment

# Absolute imports: Prefect loads deployment entrypoints by file path, as a script.
from prefect_baton._client.sync import Baton
from prefect_baton.demo import analysis, roles
from prefect_baton.prefect._accept import accept_handoff
from prefect_baton.prefect._handoff import handoff_to, start_recipient
from prefect_baton.prefect._serve import prefect_api, serving, wait_for_run

__all__ = ["operator", "researcher", "reviewer", "run_scenario", "writer"]

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


def run_scenario(
    inputs: list[str] | None = None, workers: int = 2, out_dir: str | None = None
) -> dict[str, Any]:
    """Serve the four deployments, run the chain researcher -> writer -> operator ->
    reviewer, and return each role's result (``{"researcher": {...}, ..., "reviewer":
    {"verdict": "accepted" | "rejected", ...}}``) and ``"final_states"``: each role's run
    state name read after the runner stopped (``"Completed"`` when all went well).

    Args:
        inputs: directories of ``.py`` files (default: ``json``, ``email``, ``http``).
        workers: concurrent researcher tasks (``int`` >= 1).
        out_dir: where the operator writes ``report.json`` (default ``.baton/scenario``).

    Raises:
        TimeoutError: a role's run did not finish within 600 s. Prefect API errors.
    """
    out = out_dir or str(Path(".baton/scenario").resolve())
    deployments = [
        researcher.to_deployment(name="researcher"),
        writer.to_deployment(name="writer"),
        operator.to_deployment(name="operator"),
        reviewer.to_deployment(name="reviewer"),
    ]
    results: dict[str, Any] = {}
    run_ids: dict[str, Any] = {}
    with prefect_api():
        with serving(*deployments):
            first: Any = run_deployment(
                RESEARCHER,
                parameters={"inputs": inputs, "out_dir": out, "workers": workers},
                timeout=0,
            )
            run_id: Any = first.id
            for role in ("researcher", "writer", "operator", "reviewer"):
                run_ids[role] = run_id
                done = wait_for_run(run_id, timeout_seconds=600)
                state = done.state
                results[role] = state.result() if state.is_completed() else state.name
                run_id = results[role].get("next") if isinstance(results[role], dict) else None
                if run_id is None:
                    break
        # read again once the runner has stopped: a finished run must stay finished
        results["final_states"] = {
            role: wait_for_run(rid, timeout_seconds=60).state.name for role, rid in run_ids.items()
        }
    return results
