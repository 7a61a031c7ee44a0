"""Ledger events as Prefect events: Automations, the relay, and no server outside a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prefect import flow, task

from prefect_baton import Baton
from prefect_baton.prefect import leased, publish_board, relay_events
from prefect_baton.prefect._events import prefect_event_id

from .conftest import REPO, load_script

MakeBaton = Callable[..., Baton]


def test_handoff_event_triggers_an_automation(baton_env: dict[str, str]) -> None:
    """A handoff recorded in a run emits an event whose Automation starts a deployment;
    the started run accepts it and ends Completed."""
    example = load_script("examples/prefect_automation.py")
    out = example.main()
    assert out["recipient_runs"], "the Automation did not start the recipient deployment"
    assert out["recipient_states"] == ["COMPLETED"]
    assert out["ledger"] == "accepted"


def test_relay_emits_each_ledger_event_once_per_cursor(make_baton: MakeBaton) -> None:
    """The relay emits every ledger event with a deterministic id and advances its cursor."""
    b = make_baton("agent-a")
    with b.lease("deploy", "svc", ttl_seconds=10):
        pass
    first = relay_events(b)
    assert not first.skipped
    assert first.emitted >= 2  # lease.acquired, lease.released
    assert relay_events(b).emitted == 0
    assert relay_events(b, after_seq=0).emitted == first.emitted
    ev = b.events.list(kind="lease.acquired")[0]
    assert prefect_event_id(b.org, ev.kind, ev.payload, ev.event_id) == prefect_event_id(
        b.org, ev.kind, dict(ev.payload), "other"
    )


def test_in_run_events_reach_prefect(make_baton: MakeBaton) -> None:
    """``@leased`` in a task emits lease.acquired with the task run as related resource."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventIDFilter

    @task
    @leased("deploy", "events-svc", ttl_seconds=10, baton=make_baton)
    def work() -> None:
        return None

    @flow(name="baton-test-events")
    def run() -> None:
        work()
        publish_board(baton=make_baton("baton-test-events"))

    run()
    b = make_baton("baton-test-events")
    ev = b.events.list(kind="lease.acquired")[0]
    want = prefect_event_id(b.org, ev.kind, ev.payload, ev.event_id)
    deadline = time.monotonic() + 30  # the server persists events in batches
    with get_client(sync_client=True) as client:
        while True:
            flt = EventFilter(id=EventIDFilter(id=[want]))
            page = client.read_events(filter=flt, limit=50)
            if page.events or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert [e.event for e in page.events] == ["prefect-baton.lease.acquired"]
    roles = {r.role for r in page.events[0].related}
    assert {"task-run", "flow-run", "principal"} <= roles


def test_relayed_event_keeps_its_time_and_not_the_relays_run(make_baton: MakeBaton) -> None:
    """An event relayed from inside a flow run carries the ledger's time, the
    ``prefect-baton.relayed`` label and the acting principal, not the relay's flow run."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventIDFilter

    b = make_baton("agent-relayed")
    b.leases.acquire("deploy", "relayed-svc", ttl_seconds=10)
    ev = b.events.list(kind="lease.acquired")[0]

    @flow(name="baton-test-relay")
    def relay_run() -> int:
        return relay_events(b).emitted

    assert relay_run() >= 1
    want = prefect_event_id(b.org, ev.kind, ev.payload, ev.event_id)
    deadline = time.monotonic() + 30  # the server persists events in batches
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_events(filter=EventFilter(id=EventIDFilter(id=[want])), limit=50)
            if page.events or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    (got,) = page.events
    assert got.occurred == ev.occurred_at
    assert got.resource["prefect-baton.relayed"] == "true"
    assert {r.role for r in got.related} == {"principal"}
    assert got.related[0].id == "prefect-baton.principal.agent-relayed"


def test_emission_outside_a_run_starts_no_server(tmp_path: Path) -> None:
    """Outside a run and without PREFECT_API_URL nothing is emitted and no server starts."""
    script = tmp_path / "outside.py"
    script.write_text(
        f"""
import json, os, sys
from prefect_baton import Baton
from prefect_baton.prefect import publish_board, relay_events
from prefect_baton.prefect._events import emit_ledger_event

b = Baton(ledger_url="sqlite:///{tmp_path / "l.db"}", org="o", principal="p")
with b.lease("deploy", "svc", ttl_seconds=10):
    pass
result = {{
    "relay": relay_events(b).skipped,
    "emit": emit_ledger_event("lease.acquired", "deploy/svc", {{}}, org="o", principal="p"),
    "board": publish_board(baton=b),
}}
server = sys.modules.get("prefect.server.api.server")
result["server_instances"] = len(server.SubprocessASGIServer._instances) if server else 0
result["children"] = sum(
    len(open(f"/proc/self/task/{{t}}/children").read().split())
    for t in os.listdir("/proc/self/task")
)
inodes = set()
for fd in os.listdir("/proc/self/fd"):
    try:
        link = os.readlink(f"/proc/self/fd/{{fd}}")
    except OSError:
        continue
    if link.startswith("socket:"):
        inodes.add(link[8:-1])
listening = 0
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        cols = line.split()
        listening += cols[3] == "0A" and cols[9] in inodes
result["listening"] = listening
print(json.dumps(result))
"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "BATON_"))}
    env["PREFECT_HOME"] = str(tmp_path / "home")
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {
        "relay": True,
        "emit": False,
        "board": None,
        "server_instances": 0,
        "children": 0,
        "listening": 0,
    }
    assert not (tmp_path / "home" / "prefect.db").exists()


def test_board_embeds_the_timeline_of_its_leases(make_baton: MakeBaton) -> None:
    """The board artifact of a run holding a lease embeds that resource's lease timeline as
    an SVG ``data:`` URI image, read back from the Prefect API."""
    import base64
    import re

    from prefect.artifacts import Artifact

    b = make_baton("baton-test-board")

    @flow(name="baton-test-board")
    def run() -> None:
        with b.lease("deploy", "board-svc", ttl_seconds=30):
            publish_board(baton=b, key="baton-test-board-timeline")

    run()
    art = Artifact.get("baton-test-board-timeline")
    assert art is not None
    assert art.description is not None
    assert "`deploy/board-svc`" in art.description
    (uri,) = re.findall(r"\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", art.description)
    svg = base64.b64decode(uri).decode("utf-8")
    assert 'data-epoch="1"' in svg
    assert "epoch 1 · baton-test-board" in svg
