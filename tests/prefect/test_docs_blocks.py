"""The titled blocks of ``docs/prefect.md`` that need a Prefect API, run under the harness.

``tests/docs/test_docs.py`` skips these blocks (``<!-- not-run -->``) because it runs pages
without a server. Here each block is read from the page by its title, written to a file of
that name and executed as a module (so a flow in it can be served from its file), with the
session's Prefect server and the test's ledger (``baton_env``).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import pytest

from prefect_baton import Baton
from prefect_baton.prefect import serving, wait_for_run

from .conftest import REPO, load_script

MakeBaton = Callable[..., Baton]
PAGE = REPO / "docs" / "prefect.md"
_TITLED = re.compile(
    r'^(?P<marker>[^\n]*)\n```python title="(?P<title>[^"]+)"\n(?P<code>.*?)\n```$',
    flags=re.M | re.S,
)


def doc_block(title: str) -> str:
    """The code of the ``python title="<title>"`` block of the page (marked not-run)."""
    found = {m["title"]: m for m in _TITLED.finditer(PAGE.read_text(encoding="utf-8"))}
    assert title in found, f"docs/prefect.md has no block titled {title!r}"
    assert found[title]["marker"].strip() == "<!-- not-run -->", title
    return found[title]["code"] + "\n"


def run_block(title: str, directory: Path, **names: Any) -> ModuleType:
    """Write the block to ``directory/<title>`` and execute it as a module; ``names`` are
    defined in its namespace first (values the page leaves to the reader)."""
    path = directory / title
    path.write_text(doc_block(title), encoding="utf-8")
    name = f"baton_docs_{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(names)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_deploy_task_block(
    baton_env: dict[str, str], make_baton: MakeBaton, tmp_path: Path
) -> None:
    """deploy_task.py: release("v1") leases deploy/checkout in the task, checkpoints, releases."""
    module = run_block("deploy_task.py", tmp_path)
    module.release("v1")
    b = make_baton("release")  # a flow called directly: its principal is the flow's name
    kinds = [e.kind for e in b.events.list(limit=1000) if e.kind.startswith("lease.")]
    assert kinds == ["lease.acquired", "lease.released"]
    (lease,) = b.leases.list(resource_type="deploy", owner="release", include_ended=True)
    assert (lease.resource_id, lease.owner, lease.status) == ("checkout", "release", "released")
    ck = b.checkpoints.get("checkout", "rollout")
    assert ck is not None
    assert ck.state == {"version": "v1"}


def test_handoff_flows_block(
    baton_env: dict[str, str],
    make_baton: MakeBaton,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """handoff_flows.py: writer hands r1 to the served reviewer, whose epoch is writer's + 1."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    monkeypatch.setenv("PREFECT_RESULTS_PERSIST_BY_DEFAULT", "true")  # to read the return value
    module = run_block("handoff_flows.py", tmp_path)
    assert module.reviewer(report="r0") is None  # run by hand, without a handoff_id
    with serving(module.reviewer.to_deployment(name="reviewer")):
        handoff_id = module.writer(report="r1")
        with get_client(sync_client=True) as client:
            dep = client.read_deployment_by_name("reviewer/reviewer")
            runs = [
                r
                for r in client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id]))
                )
                if r.parameters.get("handoff_id") == handoff_id
            ]
        assert len(runs) == 1
        run = wait_for_run(runs[0].id, timeout_seconds=240)
    assert run.state is not None
    assert run.state.is_completed(), run.state
    writer = make_baton("writer")
    handoff = writer.handoffs.get(handoff_id)
    assert handoff.status == "accepted"
    assert handoff.to_principal == "reviewer/reviewer"
    sent = writer.leases.get(handoff.lease_id)
    assert sent.status == "transferred"
    reviewer = make_baton("reviewer/reviewer")
    (moved,) = reviewer.leases.list(
        resource_type="report", owner=reviewer.principal, include_ended=True
    )
    assert (moved.resource_id, moved.epoch) == ("r1", sent.epoch + 1)
    assert run.state.result() == sent.epoch + 1
    progress = reviewer.checkpoints.get("r1", "progress")  # its writer reads it
    assert progress is not None
    assert progress.state == {"sections_done": 3}


def test_handoff_automation_block(baton_env: dict[str, str], tmp_path: Path) -> None:
    """handoff_automation.py: creates the Automation for a served deployment; it reads back."""
    from prefect.automations import Automation
    from prefect.client.orchestration import get_client

    inbox = load_script("examples/prefect_automation.py").inbox
    with serving(inbox.to_deployment(name="triage")):
        with get_client(sync_client=True) as client:
            dep = client.read_deployment_by_name("baton-example-inbox/triage")
        module = run_block("handoff_automation.py", tmp_path, triage_deployment_id=dep.id)
    created = module.automation
    try:
        stored = Automation.read(id=created.id)
        assert stored.name == "start-triage-on-handoff"
        assert stored.trigger.expect == {"prefect-baton.handoff.created"}
        assert stored.trigger.match.model_dump() == {
            "prefect.resource.id": "prefect-baton.handoff.*",
            "prefect-baton.to-principal": "triage",
        }
        (action,) = stored.actions
        assert action.deployment_id == dep.id
        assert action.parameters == {"handoff_id": "{{ event.payload.handoff_id }}"}
    finally:
        created.delete()


@pytest.mark.usefixtures("pg_url")  # skips (or fails in CI) without PostgreSQL
def test_block_block(tmp_path: Path) -> None:
    """block.py: saves a BatonBlock for a loopback PostgreSQL ledger, loads it, builds a client."""
    from prefect_baton.prefect import BatonBlock

    hosts = {urlsplit(u).hostname for u in re.findall(r'"(\w+://[^"]+)"', doc_block("block.py"))}
    assert hosts == {"127.0.0.1"}  # the example targets nothing but loopback
    module = run_block("block.py", tmp_path)
    b = module.b
    assert (b.org, b.principal) == ("acme", "writer")
    assert isinstance(b.events.list(limit=1), list)  # the ledger answers
    loaded = BatonBlock.load("prod")
    assert loaded.ledger_url.get_secret_value() == "postgresql://postgres@127.0.0.1:5432/test"
    b.close()


def test_lease_block_task_block(
    make_baton: MakeBaton, baton_env: dict[str, str], tmp_path: Path
) -> None:
    """lease_block_task.py: migrate() holds db/<table>; while another holds it, it ends Skipped."""
    from prefect import flow

    module = run_block("lease_block_task.py", tmp_path)

    @flow(name="nightly")
    def run() -> Any:
        return module.migrate("orders", return_state=True)

    assert run().result() == "migrated"
    with make_baton("other").lease("db", "orders", ttl_seconds=30):
        state = run()
    assert state.name == "Skipped"
    assert "db/orders" in (state.message or "")


def test_shared_principal_block(
    make_baton: MakeBaton, baton_env: dict[str, str], tmp_path: Path
) -> None:
    """shared_principal.py: each run resumes from the checkpoint of principal "writer"."""
    module = run_block("shared_principal.py", tmp_path)
    assert [module.writer(report="r9"), module.writer(report="r9")] == [1, 2]
    ck = make_baton("writer").checkpoints.get("r9", "progress")
    assert ck is not None
    assert ck.state == {"sections": 2}


def test_reject_handoff_block(
    make_baton: MakeBaton, baton_env: dict[str, str], tmp_path: Path
) -> None:
    """reject_handoff.py: a handoff whose checkpoint lacks sections 1-2 is rejected (its
    lease released at once); one with them is accepted and its lease taken over."""
    from prefect_baton.prefect import handoff_to

    module = run_block("reject_handoff.py", tmp_path)
    writer = make_baton("writer")  # the flow called directly acts as "reviewer", its name
    for report, done, status in (("r1", 1, "rejected"), ("r2", 2, "accepted")):
        held = writer.leases.acquire("report", report, ttl_seconds=60, idempotency_key=report)
        sent = handoff_to(
            "reviewer", report, checkpoint={"sections_done": done}, lease=held, baton=writer
        )
        assert module.review(report=report, handoff_id=sent.handoff_id) == status
        assert writer.handoffs.get(sent.handoff_id).status == status
        assert not writer.leases.inspect("report", report).held
    (taken,) = make_baton("reviewer").leases.list(
        resource_type="report", owner="reviewer", include_ended=True
    )
    assert (taken.resource_id, taken.status) == ("r2", "released")
