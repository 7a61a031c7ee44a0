"""Metrics recorded in process (:mod:`prefect_baton.metrics`): the counters and histograms
move with acquires, conflicts, renewals, releases, losses, handoffs and stale fences, on the
embedded SQLite ledger and with the real Redis as the authority; the gauges count the
ledger; labels never carry resource ids; the loopback listener serves the exposition; and
OpenTelemetry records the same instruments."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from prefect_baton import (
    Baton,
    ConflictError,
    IdempotencyInFlightError,
    LeaseLostError,
    StaleFenceError,
    ValidationError,
    VersionConflictError,
    metrics,
)
from prefect_baton.metrics import _state
from prefect_baton.metrics._calls import acquire_result

from ..conftest import metric_value


@pytest.mark.parametrize("ledger_url", ["sqlite", "redis"], indirect=True)
def test_counters_move_with_each_operation(metrics_recording: None, baton: Baton, org: str) -> None:
    """Granted, conflict, version conflict, renewal, release, forced release, a lease block
    that finds its lease lost, a handoff created and accepted, and a stale fence are each
    counted once under the organization and resource type, and never name the resource."""
    rid = f"secret-resource-{uuid.uuid4().hex}"
    bob = baton.as_principal("agent-b")
    boss = baton.as_principal("boss", "owner")
    lease = baton.leases.acquire("deploy", rid, ttl_seconds=60)
    with pytest.raises(ConflictError):
        bob.leases.acquire("deploy", rid, ttl_seconds=60)
    with pytest.raises(VersionConflictError):
        bob.leases.acquire("deploy", rid + "-2", ttl_seconds=60, expected_version=7)
    lease = baton.leases.renew(lease)
    assert baton.leases.release(lease).status == "released"
    with pytest.raises(StaleFenceError):
        baton.checkpoints.save(rid, "plan", {"step": 1}, fence=lease)
    with pytest.raises(LeaseLostError), baton.lease("db", rid, ttl_seconds=60) as held:
        boss.leases.force_release(held.lease_id)
    with baton.lease("db", rid, ttl_seconds=60) as held:
        handoff = baton.handoffs.create("agent-b", rid, lease=held)
        bob.handoffs.resolve(handoff.handoff_id, "accepted")

    dep = {"organization": org, "resource_type": "deploy"}
    db = {"organization": org, "resource_type": "db"}
    assert metric_value("baton_acquires_total", **dep, result="granted") == 1
    assert metric_value("baton_acquires_total", **dep, result="conflict") == 1
    assert metric_value("baton_acquires_total", **dep, result="version_conflict") == 1
    assert metric_value("baton_acquires_total", **db, result="granted") == 2
    assert metric_value("baton_acquire_seconds_count", **dep, result="granted") == 1
    assert metric_value("baton_renewals_total", **dep) == 1
    assert metric_value("baton_releases_total", **dep, status="released") == 1
    assert metric_value("baton_releases_total", **db, status="forced") == 1
    assert metric_value("baton_hold_seconds_count", **dep) == 1
    assert metric_value("baton_leases_lost_total", **db, reason="lease_lost") == 1
    assert metric_value("baton_stale_fence_rejections_total", **dep, where="checkpoint") == 1
    assert metric_value("baton_handoffs_total", organization=org, status="created") == 1
    assert metric_value("baton_handoffs_total", organization=org, status="accepted") == 1
    assert (
        metric_value("baton_handoff_resolve_seconds_count", organization=org, status="accepted")
        == 1
    )

    text = metrics.exposition(baton).decode()
    assert f'organization="{org}"' in text
    assert rid not in text
    assert "agent-b" not in text
    assert lease.lease_id not in text


@pytest.mark.parametrize("ledger_url", ["sqlite", "redis"], indirect=True)
def test_gauges_count_the_ledger_of_one_org(
    metrics_recording: None, baton: Baton, baton_in_org: Callable[..., Baton], org: str
) -> None:
    """Effective leases per resource type and pending handoffs, of the org asked for only;
    a released lease no longer counts; with Redis as the authority, the reconciler lag of
    the org is shown too."""
    other = baton_in_org(org + "-x")
    held = [baton.leases.acquire("deploy", f"r{i}", ttl_seconds=60) for i in range(3)]
    other.leases.acquire("deploy", "r0", ttl_seconds=60)
    baton.handoffs.create("agent-b", "subject")
    baton.leases.release(held[0])
    baton.authority.ledger_barrier(baton.caller)  # the ledger has caught up with Redis

    gauges = metrics._prom.StoreGauges(baton.store, baton.authority, org=org)
    families = {f.name: f for f in gauges.collect()}
    leases = families["baton_effective_leases"].samples
    assert [(s.labels, s.value) for s in leases] == [
        ({"organization": org, "resource_type": "deploy"}, 2)
    ]
    assert [s.value for s in families["baton_pending_handoffs"].samples] == [1]
    lag = families["baton_reconciler_lag_entries"].samples
    if baton.store is baton.authority:
        assert lag == []  # the ledger is the authority: no reconciler
    else:
        assert [s.labels for s in lag] == [{"organization": org}]


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_listener_serves_every_org_on_loopback(
    metrics_recording: None, baton: Baton, org: str
) -> None:
    """``enable(port=0, baton=...)`` serves the text exposition on 127.0.0.1 without a key,
    with the gauges of the ledger."""
    baton.leases.acquire("deploy", "served", ttl_seconds=60)
    listener = metrics.enable(port=0, baton=baton)
    assert listener is not None
    try:
        r = httpx.get(f"http://127.0.0.1:{listener.port}/metrics", timeout=30)
    finally:
        listener.close()
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    line = f'baton_effective_leases{{organization="{org}",resource_type="deploy"}} 1.0'
    assert line in r.text
    assert (
        f'baton_acquires_total{{organization="{org}",resource_type="deploy",result="granted"}}'
        in r.text
    )


@pytest.mark.parametrize("port", [-1, 65536, "9464", True])
def test_enable_refuses_a_bad_port(port: object) -> None:
    """A port that is not an integer from 0 to 65535 is a ValidationError naming it."""
    with pytest.raises(ValidationError, match="metrics port must be an integer"):
        metrics.enable(port=port)  # type: ignore[arg-type]


@pytest.fixture
def no_labels_seen(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No label value seen yet in this process, and a cap of 2 resource types per
    organization; the monkeypatch, for more settings."""
    monkeypatch.setattr(_state, "_seen", {})
    monkeypatch.setattr(_state, "_totals", {"organization": 0, "resource_type": 0})
    monkeypatch.setitem(_state.MAX_LABEL_VALUES, "resource_type", 2)
    return monkeypatch


@pytest.mark.usefixtures("no_labels_seen")
def test_label_values_are_capped() -> None:
    """Past the cap of distinct resource types of one organization, its new ones are
    recorded as ``_other``."""
    assert [_state.bounded("resource_type", t, "o1") for t in ("a", "b", "c", "a")] == [
        "a",
        "b",
        "_other",
        "a",
    ]


def test_one_organizations_resource_types_do_not_fold_anothers(
    no_labels_seen: pytest.MonkeyPatch,
) -> None:
    """The resource-type cap counts per organization: an organization that has used up its
    own cap does not turn another organization's types into ``_other``; the total over all
    organizations is capped too."""
    no_labels_seen.setitem(_state.MAX_LABEL_TOTAL, "resource_type", 5)
    assert [_state.bounded("resource_type", t, "noisy") for t in ("a", "b", "c", "d")] == [
        "a",
        "b",
        "_other",
        "_other",
    ]
    assert [_state.bounded("resource_type", t, "quiet") for t in ("a", "x")] == ["a", "x"]
    assert _state.bounded("resource_type", "y", "third") == "y"
    assert _state.bounded("resource_type", "z", "third") == "_other"  # 5 pairs in all
    assert _state.bounded("resource_type", "y", "third") == "y"


def test_gauges_fold_resource_types_per_organization(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease gauges keep each organization's largest resource types up to the cap and
    fold only that organization's others into ``_other``."""
    from prometheus_client.core import GaugeMetricFamily

    from prefect_baton.metrics import _prom

    monkeypatch.setitem(_state.MAX_LABEL_VALUES, "resource_type", 2)
    family = GaugeMetricFamily("g", "help", labels=["organization", "resource_type"])
    rows = [("noisy", "a", 9), ("noisy", "b", 8), ("noisy", "c", 7), ("quiet", "x", 1)]
    rows += [("noisy", "d", 1)]
    _prom.StoreGauges._leases(family, rows)
    got = {(s.labels["organization"], s.labels["resource_type"]): s.value for s in family.samples}
    assert got == {
        ("noisy", "a"): 9,
        ("noisy", "b"): 8,
        ("noisy", "_other"): 8,
        ("quiet", "x"): 1,
    }


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_otel_records_the_same_instruments(baton: Baton, org: str) -> None:
    """``enable(otel=True)`` records through the given OpenTelemetry meter provider, with the
    organization and resource type as attributes."""
    before = _state.SINKS
    reader = InMemoryMetricReader()
    try:
        metrics.enable(otel=True, meter_provider=MeterProvider(metric_readers=[reader]))
        baton.leases.acquire("deploy", "otel", ttl_seconds=60)
    finally:
        _state.set_sinks(before)
    data = reader.get_metrics_data()
    assert data is not None
    points = [
        (m.name, dict(p.attributes or {}), getattr(p, "value", None))
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in m.data.data_points
    ]
    granted = {"organization": org, "resource_type": "deploy", "result": "granted"}
    assert ("baton_acquires", granted, 1) in points


def test_every_metric_is_documented() -> None:
    """``docs/operations.md`` lists every counter, histogram and gauge with its labels."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    for spec in [*metrics.INSTRUMENTS.values(), *metrics.GAUGES.values()]:
        name = f"{spec.name}_total" if spec.kind == "counter" else spec.name
        labels = ", ".join(f"`{label}`" for label in spec.labels)
        assert f"| `{name}` | {spec.kind} | {labels} |" in page, name


def test_fencing_guards_count_their_rejections(metrics_recording: None, tmp_path: Path) -> None:
    """The SQL guard and the header check of :mod:`prefect_baton.fencing` count each
    stale write by resource type and ``where`` (no organization: the guard has none)."""
    from sqlalchemy import create_engine

    from prefect_baton.fencing import (
        FencingToken,
        ensure_fence_table,
        guard,
        headers,
        token_from_headers,
    )

    rtype = f"fenced-{uuid.uuid4().hex[:8]}"
    labels = {"organization": "", "resource_type": rtype}
    engine = create_engine(f"sqlite:///{tmp_path / 'user.db'}")
    ensure_fence_table(engine)
    with engine.begin() as conn:
        guard(conn, FencingToken(rtype, "svc", 5))
    with pytest.raises(StaleFenceError), engine.begin() as conn:
        guard(conn, FencingToken(rtype, "svc", 4))
    sent = headers(FencingToken(rtype, "other", 5))
    with pytest.raises(StaleFenceError):
        token_from_headers(sent, rtype, "svc")
    engine.dispose()
    assert metric_value("baton_stale_fence_rejections_total", **labels, where="sql") == 1
    assert metric_value("baton_stale_fence_rejections_total", **labels, where="http") == 1


def test_importing_the_package_does_not_import_prometheus_client() -> None:
    """Until metrics are enabled, ``import prefect_baton`` (client, keeper, fencing) leaves
    ``prometheus_client`` unimported."""
    code = (
        "import sys, prefect_baton, prefect_baton.fencing; "
        "print('prometheus_client' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("error", "result"),
    [
        (
            VersionConflictError("version 2 expected", current_version=3, expected_version=2),
            "version_conflict",
        ),
        (ConflictError("held by agent-b"), "conflict"),
        (IdempotencyInFlightError("key in flight"), "in_flight"),
        (LeaseLostError("lapsed"), "lost"),
        (ValidationError("bad ttl"), "error"),
        (RuntimeError("driver failure"), "error"),
        (None, "error"),
    ],
)
def test_a_refused_acquire_is_labelled_by_its_error_code(
    error: BaseException | None, result: str
) -> None:
    """The ``result`` label of an acquire that returned no lease follows the error's stable
    code, so a dashboard can tell contention (``conflict``, ``version_conflict``), a retry
    still in flight and a lost lease from other failures (``error``)."""
    assert acquire_result(None, error) == result
