"""The instruments prefect-baton records: name, kind, labels, unit and meaning of each, as
data. The Prometheus and OpenTelemetry backends both build their instruments from
:data:`INSTRUMENTS`, and the gauges computed at scrape time are :data:`GAUGES`; the tables
in ``docs/operations.md`` list the same. No I/O, no third-party import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "GAUGES",
    "INSTRUMENTS",
    "MAX_LABEL_TOTAL",
    "MAX_LABEL_VALUES",
    "OTHER",
    "Instrument",
]

#: Distinct values one label takes in one process: organizations in all, resource types per
#: organization (one organization's many types never fold another's into :data:`OTHER`);
#: later new values are recorded as :data:`OTHER`, so a caller cannot grow the series
#: without bound.
MAX_LABEL_VALUES = {"organization": 1000, "resource_type": 200}
#: Distinct values one label takes in one process over all organizations together (for
#: ``resource_type``: distinct (organization, resource type) pairs); past it new values are
#: recorded as :data:`OTHER` too.
MAX_LABEL_TOTAL = {"organization": 1000, "resource_type": 5000}
#: The label value that stands for every value past :data:`MAX_LABEL_VALUES`.
OTHER = "_other"

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_WAIT = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
_HOLD = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)


@dataclass(frozen=True)
class Instrument:
    """One metric.

    Attributes:
        name: the Prometheus name (``str``); a counter is exposed as ``<name>_total``.
        kind: ``counter``, ``histogram`` (both recorded as events happen) or ``gauge``
            (computed from the ledger when scraped).
        labels: the label names, in order (``tuple[str, ...]``); only organization,
            resource type and a bounded result/status/reason/kind, never ids or secrets.
        unit: ``seconds``, or ``""`` for a count.
        help: what it counts (``str``).
        buckets: a histogram's bucket bounds in seconds (``tuple[float, ...]``).
    """

    name: str
    kind: Literal["counter", "histogram", "gauge"]
    labels: tuple[str, ...]
    unit: str
    help: str
    buckets: tuple[float, ...] = ()


_OR = ("organization", "resource_type")

INSTRUMENTS = {
    i.name: i
    for i in (
        Instrument(
            "baton_acquires",
            "counter",
            (*_OR, "result"),
            "",
            "Lease acquires by result: granted, replayed, conflict, version_conflict, "
            "in_flight, lost (a replay of a lease since lost) or error (any other refusal). "
            "acquire_many counts each resource it grants, and a refusal once with an empty "
            "resource_type.",
        ),
        Instrument(
            "baton_acquire_seconds",
            "histogram",
            (*_OR, "result"),
            "seconds",
            "Duration of one acquire call, including the wait for the ledger's or Redis's "
            "lock, by result.",
            _LATENCY,
        ),
        Instrument(
            "baton_acquire_wait_seconds",
            "histogram",
            _OR,
            "seconds",
            "Time from a leased Prefect task's first acquire attempt until it holds the "
            "lease, including on_conflict='wait' retries.",
            _WAIT,
        ),
        Instrument(
            "baton_renewals",
            "counter",
            _OR,
            "",
            "Lease renewals that succeeded.",
        ),
        Instrument(
            "baton_renew_failures",
            "counter",
            (*_OR, "reason"),
            "",
            "Lease renewals refused or failed, by reason (the error code in lower case, "
            "e.g. lease_lost, unavailable).",
        ),
        Instrument(
            "baton_leases_lost",
            "counter",
            (*_OR, "reason"),
            "",
            "Leases a lease block found lost, by reason: renew_deadline, max_hold, expired "
            "(run out before the release) or the error code of the refused renewal or "
            "release (lease_lost, not_found).",
        ),
        Instrument(
            "baton_releases",
            "counter",
            (*_OR, "status"),
            "",
            "Releases by status: released, expired, no_change, forced, or the error code "
            "of a refused release (lease_lost, not_found, ...).",
        ),
        Instrument(
            "baton_hold_seconds",
            "histogram",
            _OR,
            "seconds",
            "How long a lease generation was held, from its grant to its release "
            "(released, expired or forced).",
            _HOLD,
        ),
        Instrument(
            "baton_handoffs",
            "counter",
            ("organization", "status"),
            "",
            "Handoffs by status: created, accepted, rejected.",
        ),
        Instrument(
            "baton_handoff_resolve_seconds",
            "histogram",
            ("organization", "status"),
            "seconds",
            "Time from a handoff's creation to its resolution, by status (accepted or rejected).",
            _HOLD,
        ),
        Instrument(
            "baton_stale_fence_rejections",
            "counter",
            (*_OR, "where"),
            "",
            "Writes rejected with STALE_FENCE, by where: checkpoint, outcome, handoff "
            "(ledger records) or sql, http, object (the guards of prefect_baton.fencing, "
            "whose organization is empty).",
        ),
        Instrument(
            "baton_events_relayed",
            "counter",
            ("organization", "kind"),
            "",
            "Ledger events relayed to Prefect events by relay_events, by event kind.",
        ),
    )
}
"""The counters and histograms, by name."""

GAUGES = {
    g.name: g
    for g in (
        Instrument(
            "baton_effective_leases",
            "gauge",
            _OR,
            "",
            "Leases effective now (active and not past their expiry) in the ledger.",
        ),
        Instrument(
            "baton_pending_handoffs",
            "gauge",
            ("organization",),
            "",
            "Handoffs pending and not past their expiry.",
        ),
        Instrument(
            "baton_reconciler_lag_entries",
            "gauge",
            ("organization",),
            "",
            "Redis journal entries not yet trimmed by the reconciler (Redis authority only).",
        ),
        Instrument(
            "baton_reconciler_lag_seconds",
            "gauge",
            ("organization",),
            "seconds",
            "Age of the oldest such journal entry on the Redis clock (Redis authority only).",
        ),
    )
}
"""The gauges computed from the stores when scraped, by name."""
