"""The lease timeline of a resource (``prefect_baton.timeline``, ``baton timeline``): one real
scenario (acquire, renew, expiry and takeover, a stale fenced write, transfer, a handoff
carrying the lease, an outcome with evidence, release) on the embedded SQLite ledger (a
file, on a manual clock) and on the real Redis authority, drawn and read back."""

from __future__ import annotations

import base64
import re
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prefect_baton import Baton, Event, Lease, Page, StaleFenceError, ValidationError
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton.prefect import timelines_markdown
from prefect_baton.testing import ManualClock
from prefect_baton.timeline import (
    Timeline,
    build_timeline,
    read_events,
    render_html,
    render_svg,
    write_timeline,
)
from prefect_baton.timeline._build import _resource_events
from tests.cli.conftest import Cli
from tests.conformance._util import wait_until_expired
from tests.conformance.test_event_filters import RID as F_RID
from tests.conformance.test_event_filters import RT as F_RT
from tests.conformance.test_event_filters import _history
from tests.conftest import redis_authority

RT, RID = "file", "report.py"
EVIDENCE_URI = "https://ci.example/run/42"
SVG = "{http://www.w3.org/2000/svg}"

#: The marks of the scenario, in the order they happened.
MARK_ORDER = [
    "acquired",
    "renewed",
    "expired",
    "taken_over",
    "fence_rejected",
    "transferred",
    "handoff_created",
    "handoff_accepted",
    "outcome",
    "released",
]


@dataclass
class Scenario:
    """A finished scenario: the org's first client (``alice``) and its leases."""

    alice: Baton
    leases: list[Lease]
    ledger_url: str


def _run(alice: Baton, ledger_url: str, tick: Callable[[], None]) -> Scenario:
    """Run the scenario; ``tick()`` between steps moves time on, so that no two steps share
    a millisecond."""
    bob, carol, dave = (alice.as_principal(p) for p in ("bob", "carol", "dave"))
    first = alice.leases.acquire(
        RT, RID, ttl_seconds=10, purpose="analyse report.py", idempotency_key="alice-1"
    )
    tick()
    first = alice.leases.renew(first)
    wait_until_expired(alice, first)
    second = bob.leases.acquire(RT, RID, ttl_seconds=60, idempotency_key="bob-1")
    tick()
    with pytest.raises(StaleFenceError):
        alice.checkpoints.save(RID, "progress", {"chunk": 3}, fence=first)
    tick()
    third = bob.leases.transfer(
        second, to_principal="carol", new_execution_key="carol-1", ttl_seconds=60
    )
    tick()
    offer = carol.handoffs.create("dave", RID, lease=third, message="please finish")
    tick()
    fourth = dave.handoffs.resolve(offer.handoff_id, "accepted").lease
    assert fourth is not None
    tick()
    dave.outcomes.record(
        RID,
        "succeeded",
        evidence=[{"kind": "log", "uri": EVIDENCE_URI, "digest": "sha256:" + "ab" * 32}],
        fence=fourth,
    )
    tick()
    dave.leases.release(fourth)
    return Scenario(alice, [first, second, third, fourth], ledger_url)


def _fresh(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('timeline') / 'ledger.db'}"
    return url, f"org-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def sqlite_scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    """The scenario on a SQLite file ledger on a :class:`ManualClock` (expiry by moving
    the clock)."""
    url, org = _fresh(tmp_path_factory)
    clock = ManualClock()
    store = LedgerStore(url, clock=clock)
    alice = Baton(org=org, principal="alice", store=store)
    yield _run(alice, url, lambda: clock.advance(1))
    alice.close()
    store.close()


@pytest.fixture(scope="module")
def redis_scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    """The scenario on the real Redis authority (``ack="redis"``) in front of a SQLite
    ledger (expiry by waiting out the 10 s TTL on the Redis clock)."""
    url, org = _fresh(tmp_path_factory)
    store = LedgerStore(url)
    authority = redis_authority("redis", store)
    alice = Baton(org=org, principal="alice", store=store, lease_authority=authority)
    yield _run(alice, url, lambda: time.sleep(0.01))
    authority.close()
    store.close()


@pytest.fixture(params=["sqlite", "redis"])
def scenario(request: pytest.FixtureRequest) -> Scenario:
    """The scenario of each arm in turn."""
    scenario: Scenario = request.getfixturevalue(f"{request.param}_scenario")
    return scenario


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def _bands(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if "band" in g.get("class", "").split()]


def _marks(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if "mark" in g.get("class", "").split()]


def _title(el: ET.Element) -> str:
    title = el.find(f"{SVG}title")
    assert title is not None
    assert title.text is not None
    return title.text


def test_generations_and_marks_in_order(scenario: Scenario) -> None:
    """Four epochs as four bands, each ending the way it did, and every mark in order."""
    owner = scenario.alice.as_principal("root", role="owner")
    tl = build_timeline(owner, RT, RID)
    assert [g.lease_id for g in tl.generations] == [lease.lease_id for lease in scenario.leases]
    assert [(g.epoch, g.holder, g.start, g.end) for g in tl.generations] == [
        (1, "alice", "acquired", "taken_over"),
        (2, "bob", "taken_over", "transferred"),
        (3, "carol", "transferred", "handed_off"),
        (4, "dave", "handed_off", "released"),
    ]
    assert tl.generations[0].renewals == 1
    assert tl.generations[0].purpose == "analyse report.py"
    assert tl.generations[0].execution_key == "alice-1"

    root = _parse(render_svg(tl))
    bands = _bands(root)
    assert [(b.get("data-epoch"), b.get("data-end")) for b in bands] == [
        ("1", "taken_over"),
        ("2", "transferred"),
        ("3", "handed_off"),
        ("4", "released"),
    ]
    labels = ["".join(t.itertext()) for b in bands for t in b.iter(f"{SVG}text")]
    assert labels == ["epoch 1 · alice", "epoch 2 · bob", "epoch 3 · carol", "epoch 4 · dave"]
    marks = _marks(root)
    assert [m.get("data-kind") for m in marks] == MARK_ORDER
    rejected = next(m for m in marks if m.get("data-kind") == "fence_rejected")
    assert rejected.get("data-epoch") == "1"  # the late writer's stale epoch
    assert "checkpoint.save by alice rejected" in _title(rejected)
    outcome = next(m for m in marks if m.get("data-kind") == "outcome")
    assert outcome.get("data-epoch") == "4"
    assert EVIDENCE_URI in _title(outcome)
    legend = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "legend")
    assert "fenced write rejected" in "".join(legend.itertext())

    page = render_html(tl)
    assert f'<a href="{EVIDENCE_URI}">' in page
    assert page.count("<svg") == 1


def test_reader_without_the_role_sees_no_holders(scenario: Scenario) -> None:
    """An agent that held none of the generations sees the bands and marks, but no holder,
    purpose, execution key or handoff party; alice sees only her own generation."""
    eve = scenario.alice.as_principal("eve")
    tl = build_timeline(eve, RT, RID)
    assert [g.holder for g in tl.generations] == [None, None, None, None]
    assert all(g.purpose is None and g.execution_key is None for g in tl.generations)
    assert all(m.principal is None for m in tl.marks)
    svg = render_svg(tl)
    for name in ("alice", "bob", "carol", "dave", "analyse report.py"):
        assert name not in svg
    assert [b.get("data-epoch") for b in _bands(_parse(svg))] == ["1", "2", "3", "4"]

    own = build_timeline(scenario.alice, RT, RID)
    assert [g.holder for g in own.generations] == ["alice", None, None, None]
    assert own.generations[0].purpose == "analyse report.py"


def test_another_org_sees_nothing(scenario: Scenario) -> None:
    """The same resource read from another organization is an empty timeline: no band."""
    b = scenario.alice
    other = Baton(org=f"org-{uuid.uuid4().hex[:12]}", principal="root", role="owner", store=b.store)
    other.authority = b.authority
    tl = build_timeline(other, RT, RID)
    assert tl.empty
    root = _parse(render_svg(tl))
    assert _bands(root) == []
    assert _marks(root) == []


def test_since_keeps_the_later_part(scenario: Scenario) -> None:
    """``since`` drops the generations that ended and the marks made before it."""
    owner = scenario.alice.as_principal("root", role="owner")
    full = build_timeline(owner, RT, RID)
    cut = next(m.at for m in full.marks if m.kind == "transferred")
    tl = build_timeline(owner, RT, RID, since=cut)
    assert [g.epoch for g in tl.generations] == [2, 3, 4]
    assert [m.kind for m in tl.marks] == MARK_ORDER[MARK_ORDER.index("transferred") :]
    dropped = MARK_ORDER.index("transferred") + 1  # the marks before the cut, generation 1
    assert tl.before_since == dropped
    assert not tl.empty


def test_cli_writes_the_file(sqlite_scenario: Scenario, tmp_path: Path) -> None:
    """``baton timeline`` writes SVG, HTML or PNG and prints the path; another extension
    is VALIDATION_ERROR, an unknown resource NOT_FOUND; nothing is written for either."""
    cli = Cli(sqlite_scenario.ledger_url, sqlite_scenario.alice.org)
    out = tmp_path / "sub" / "timeline.svg"
    out.parent.mkdir()  # an existing directory: a missing one is refused (test_cli_inputs)
    run = cli("timeline", RT, RID, "--out", str(out), principal="root", role="owner", fmt="json")
    assert run.code == 0, run.text
    assert run.json["timeline"]["path"] == str(out.resolve())
    assert run.json["timeline"]["generations"] == 4
    assert [b.get("data-epoch") for b in _bands(_parse(out.read_text()))] == ["1", "2", "3", "4"]
    html = tmp_path / "timeline.html"
    assert cli("timeline", RT, RID, "-o", str(html), principal="eve", role="agent").code == 0
    assert "bob" not in html.read_text()

    png = tmp_path / "timeline.png"
    assert cli("timeline", RT, RID, "--out", str(png), principal="root", role="owner").code == 0
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    bad = cli("timeline", RT, RID, "--out", str(tmp_path / "t.pdf"), principal="root", role="owner")
    assert (bad.code, bad.json["error"]["code"]) == (2, "VALIDATION_ERROR")
    missing = cli(
        "timeline",
        RT,
        "nope.py",
        "--out",
        str(tmp_path / "n.svg"),
        principal="root",
        role="owner",
        fmt="json",
    )
    assert (missing.code, missing.json["error"]["code"]) == (5, "NOT_FOUND")
    assert not (tmp_path / "t.pdf").exists()
    assert not (tmp_path / "n.svg").exists()


def test_cli_since_after_all_history_names_the_window(
    sqlite_scenario: Scenario, tmp_path: Path
) -> None:
    """``--since`` after the resource's whole history is NOT_FOUND saying that nothing falls
    in that window (and how much was left out before it), not that there is no history; a
    resource never leased still says nothing of it is visible."""
    cli = Cli(sqlite_scenario.ledger_url, sqlite_scenario.alice.org)
    out = tmp_path / "t.svg"
    owner = sqlite_scenario.alice.as_principal("root", role="owner")
    full = build_timeline(owner, RT, RID)
    run = cli(
        "timeline", RT, RID, "-o", str(out), "--since", "2099-01-01T00:00:00Z",
        principal="root", role="owner", fmt="json",
    )  # fmt: skip
    assert (run.code, run.json["error"]["code"]) == (5, "NOT_FOUND")
    left_out = len(full.generations) + len(full.marks)
    assert run.json["error"]["message"] == (
        f"no lease history of {RT}/{RID} falls in the window since 2099-01-01T00:00:00.000Z "
        f"({left_out} earlier generation(s) and mark(s) left out)"
    )
    never = cli(
        "timeline", RT, "never.py", "-o", str(out), "--since", "2099-01-01T00:00:00Z",
        principal="root", role="owner", fmt="json",
    )  # fmt: skip
    assert never.json["error"]["message"] == (
        f"no lease history of {RT}/never.py visible in org {sqlite_scenario.alice.org}"
    )
    assert not out.exists()


def test_board_embeds_the_timeline_as_an_svg_image(sqlite_scenario: Scenario) -> None:
    """The Prefect board's markdown carries the timeline as a ``data:`` URI SVG image (the
    same bands), and leaves out a resource with nothing visible."""
    owner = sqlite_scenario.alice.as_principal("root", role="owner")
    text = timelines_markdown(owner, [(RT, RID), (RT, "never-leased.py")])
    assert f"`{RT}/{RID}`" in text
    assert "never-leased.py" not in text
    (uri,) = re.findall(r"\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", text)
    root = _parse(base64.b64decode(uri).decode("utf-8"))
    assert [b.get("data-epoch") for b in _bands(root)] == ["1", "2", "3", "4"]
    assert timelines_markdown(owner, []) == ""


def test_png_without_resvg_is_a_validation_error(
    sqlite_scenario: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the optional resvg-py package a .png is refused with VALIDATION_ERROR naming
    the extra to install, and nothing is written."""
    monkeypatch.setitem(sys.modules, "resvg_py", None)  # import fails
    tl = build_timeline(sqlite_scenario.alice, RT, RID)
    with pytest.raises(ValidationError, match=r"prefect-baton\[png\]"):
        write_timeline(tl, tmp_path / "t.png")
    assert not (tmp_path / "t.png").exists()


def test_write_timeline_needs_an_existing_writable_directory(
    sqlite_scenario: Scenario, tmp_path: Path
) -> None:
    """``write_timeline`` creates no directory: a missing parent, or a path the system
    refuses (a directory), is VALIDATION_ERROR naming the path; an existing file is
    replaced."""
    tl = build_timeline(sqlite_scenario.alice, RT, RID)
    with pytest.raises(ValidationError, match=r"its directory '.*/no' does not exist"):
        write_timeline(tl, tmp_path / "no" / "t.svg")
    assert not (tmp_path / "no").exists()
    (tmp_path / "d.html").mkdir()
    with pytest.raises(ValidationError, match=r"cannot write timeline file '.*d\.html': "):
        write_timeline(tl, tmp_path / "d.html")
    out = tmp_path / "t.svg"
    out.write_text("old")
    assert write_timeline(tl, out) == out
    assert out.read_text().startswith("<svg")


@pytest.mark.parametrize("fails", ["write", "fsync", "replace"])
def test_a_failed_write_leaves_the_old_file_and_no_partial_one(
    sqlite_scenario: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    """The file is written to a temporary file in the same directory, then renamed over
    the target: a failure while writing, flushing or renaming (a full disk, a crash) leaves
    the old file whole and no temporary file behind, and is VALIDATION_ERROR naming the
    path."""
    import os

    tl = build_timeline(sqlite_scenario.alice, RT, RID)
    out = tmp_path / "t.svg"
    out.write_text("old")
    out.chmod(0o640)

    def broken(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    if fails == "write":
        monkeypatch.setattr(os, "fsync", lambda _fd: None)
        real_fdopen = os.fdopen

        def half_written(fd: int, *a: Any, **k: Any) -> Any:
            f = real_fdopen(fd, *a, **k)
            real_write = f.write

            def write(data: bytes) -> int:
                real_write(data[: len(data) // 2])
                raise OSError(28, "No space left on device")

            f.write = write
            return f

        monkeypatch.setattr(os, "fdopen", half_written)
    else:
        monkeypatch.setattr(os, fails, broken)
    with pytest.raises(ValidationError, match=r"cannot write timeline file '.*t\.svg': No space"):
        write_timeline(tl, out)
    monkeypatch.undo()
    assert out.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.svg"]
    assert write_timeline(tl, out) == out
    assert out.read_text().startswith("<svg")
    assert out.stat().st_mode & 0o777 == 0o640  # the replaced file's mode is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.svg"]


def test_characters_xml_forbids_leave_the_picture_well_formed(tmp_path: Path) -> None:
    """A purpose holding control characters and U+FFFF (which the API accepts) is drawn with
    U+FFFD in their place: the SVG still parses as XML."""
    b = Baton(
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        org=f"org-{uuid.uuid4().hex[:12]}",
        principal="alice",
    )
    try:
        b.leases.acquire(RT, "odd.py", ttl_seconds=30, purpose="x\x01y\x1b[31m\uffff")
        svg = render_svg(build_timeline(b, RT, "odd.py"))
    finally:
        b.close()
    assert "\x01" not in svg
    assert "\x1b" not in svg
    assert "\uffff" not in svg
    assert "x\ufffdy\ufffd[31m\ufffd" in svg
    ET.fromstring(svg)


def _drawn(tl: Timeline) -> dict[str, object]:
    return tl.model_dump(exclude={"generated_at"})


@pytest.mark.parametrize("role", ["agent", "owner"])
def test_filtered_read_draws_what_the_whole_stream_draws(baton: Baton, role: str) -> None:
    """On every arm, the timeline read through the event filters (the default) equals the
    one folded from the org's whole stream (``events=read_events(...)``), for each viewer
    role: the resource's generations, a handoff carrying its lease under another subject,
    the handoff and outcome of its subject, and a stale fenced write; and so does another
    resource's. Resources whose ``<type>/<id>`` subjects coincide are kept apart."""
    _history(baton)
    viewer = baton.as_principal("viewer", role)
    everything = read_events(viewer)
    for rtype, rid in ((F_RT, F_RID), (F_RT, "svc-2")):
        filtered = build_timeline(viewer, rtype, rid)
        assert _drawn(filtered) == _drawn(build_timeline(viewer, rtype, rid, events=everything))
    whole = build_timeline(viewer, F_RT, F_RID)
    assert len(whole.generations) == 2
    assert {m.kind for m in whole.marks} >= {
        "handoff_created",
        "handoff_accepted",
        "fence_rejected",
        "outcome",
    }
    for rtype, rid in ((F_RT, f"{F_RID}/x"), (f"{F_RT}/{F_RID}", "x")):
        assert len(build_timeline(viewer, rtype, rid).generations) == 1


def test_an_event_committed_between_the_filtered_reads_is_in_both_or_neither(
    baton: Baton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timeline reads the resource's events by two filters (its leases', its
    subject's); writes committed right after the first read (a renewal of its lease, then
    an outcome of its subject) are both in the events it folds, as in one read of the
    whole stream, not the outcome alone."""
    lease = baton.leases.acquire("deploy", "race", ttl_seconds=60)
    real = baton.events.list
    reads: list[dict[str, object]] = []

    def list_then_write(*args: Any, **kwargs: Any) -> Page[Event]:
        page = real(*args, **kwargs)
        reads.append(kwargs)
        if len(reads) == 1:  # the first filtered read: commit under both filters now
            baton.leases.renew(lease)
            baton.outcomes.record("race", "failed")
        return page

    monkeypatch.setattr(baton.events, "list", list_then_write)
    got = [e.kind for e in _resource_events(baton, "deploy", "race")]
    assert got == ["lease.acquired", "lease.renewed", "outcome.recorded"]
    assert reads[0]["resource_type"] == "deploy"
    monkeypatch.undo()
    whole = build_timeline(baton, "deploy", "race", events=read_events(baton))
    assert _drawn(build_timeline(baton, "deploy", "race")) == _drawn(whole)
