"""The Prometheus backend: the module's own :data:`REGISTRY` of counters and histograms
(built from :data:`~prefect_baton.metrics._specs.INSTRUMENTS`), the gauges computed from the
stores when scraped (:class:`StoreGauges`), the view of one organization
(:class:`Exposition`) and the loopback listener (:func:`listen`).

With ``PROMETHEUS_MULTIPROC_DIR`` set (``baton serve --workers N`` with N > 1 sets it for
its workers), the counters and histograms are prometheus_client's multiprocess values and
every read sums the files of all processes (:func:`recorded`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import start_http_server
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from prefect_baton.errors import BatonError, UnavailableError
from prefect_baton.metrics._specs import (
    GAUGES,
    INSTRUMENTS,
    MAX_LABEL_TOTAL,
    MAX_LABEL_VALUES,
    OTHER,
)

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prefect_baton._stores.ledger.store import LedgerStore
    from prefect_baton._stores.protocol import LeaseAuthority

__all__ = [
    "REGISTRY",
    "Exposition",
    "Listener",
    "PrometheusSink",
    "StoreGauges",
    "exposition",
    "listen",
    "recorded",
]

log = logging.getLogger("prefect_baton.metrics")

#: The registry of prefect-baton's counters and histograms (not prometheus_client's global
#: one, so an application's own metrics and several apps in one process do not collide).
REGISTRY = CollectorRegistry(auto_describe=False)

_METRICS: dict[str, Counter | Histogram] = {
    spec.name: (
        Counter(spec.name, spec.help, spec.labels, registry=REGISTRY)
        if spec.kind == "counter"
        else Histogram(spec.name, spec.help, spec.labels, registry=REGISTRY, buckets=spec.buckets)
    )
    for spec in INSTRUMENTS.values()
}


class PrometheusSink:
    """Records into :data:`REGISTRY` (a :class:`~prefect_baton.metrics._state.Sink`),
    keeping each labelled child it made (their number is bounded as the labels are)."""

    def __init__(self) -> None:
        self._children: dict[tuple[str, tuple[str, ...]], Callable[[float], None]] = {}

    def add(self, name: str, labels: tuple[str, ...], value: float) -> None:
        """Add ``value`` to counter ``name`` or observe it on histogram ``name``."""
        key = (name, labels)
        add = self._children.get(key)
        if add is None:
            metric = _METRICS[name]
            if isinstance(metric, Counter):
                add = metric.labels(*labels).inc
            else:
                add = metric.labels(*labels).observe
            self._children[key] = add
        add(value)


def recorded() -> Collector:
    """The counters and histograms as recorded: :data:`REGISTRY`, or with
    ``PROMETHEUS_MULTIPROC_DIR`` set, the sum over the files of every process."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return REGISTRY
    merged = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(merged, path)  # type: ignore[no-untyped-call]
    return merged


@dataclass
class StoreGauges(Collector):
    """The gauges of :data:`~prefect_baton.metrics._specs.GAUGES`, computed from the stores
    at each scrape (a few count queries on the ledger; two Redis commands per organization
    for the reconciler lag, only when ``authority`` is a Redis authority).

    A store that cannot be read leaves its gauges out of that scrape (logged), rather than
    failing the whole scrape.

    Attributes:
        store: the SQL ledger (:class:`~prefect_baton._stores.ledger.store.LedgerStore`).
        authority: the lease authority (``None`` or the ledger itself: no reconciler lag).
        org: only this organization (``str``), or ``None`` for every one.
    """

    store: LedgerStore
    authority: LeaseAuthority | None = None
    org: str | None = None

    def collect(self) -> Iterator[Metric]:
        """The gauge families (``GaugeMetricFamily``)."""
        from prefect_baton._stores.ledger.counts import effective_leases, pending_handoffs

        families = {name: self._family(name) for name in GAUGES}
        try:
            self._leases(families["baton_effective_leases"], effective_leases(self.store, self.org))
            for org, n in pending_handoffs(self.store, self.org):
                families["baton_pending_handoffs"].add_metric([org], n)
        except BatonError as exc:
            log.warning("metrics: the ledger's gauges are left out of this scrape: %s", exc)
        try:
            self._lag(families)
        except BatonError as exc:
            log.warning("metrics: the reconciler lag is left out of this scrape: %s", exc)
        yield from families.values()

    @staticmethod
    def _family(name: str) -> GaugeMetricFamily:
        spec = GAUGES[name]
        return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels, unit=spec.unit)

    @staticmethod
    def _leases(family: GaugeMetricFamily, rows: Iterable[tuple[str, str, int]]) -> None:
        """Add ``rows`` (largest first), folding each organization's resource types past
        the label cap (per organization, and over all organizations together) into
        ``_other``."""
        kept: dict[str, set[str]] = {}
        total = 0
        other: dict[str, int] = {}
        for org, rtype, n in rows:
            mine = kept.setdefault(org, set())
            if rtype in mine or (
                len(mine) < MAX_LABEL_VALUES["resource_type"]
                and total < MAX_LABEL_TOTAL["resource_type"]
            ):
                total += rtype not in mine
                mine.add(rtype)
                family.add_metric([org, rtype], n)
            else:
                other[org] = other.get(org, 0) + n
        for org, n in other.items():
            family.add_metric([org, OTHER], n)

    def _lag(self, families: dict[str, GaugeMetricFamily]) -> None:
        from prefect_baton._stores.redis.authority import RedisAuthority
        from prefect_baton._stores.redis.reconciler import registered_orgs

        auth = self.authority
        if not isinstance(auth, RedisAuthority):
            return
        orgs = [self.org] if self.org is not None else registered_orgs(auth.client)
        for org in orgs:
            lag = auth.reconciler.lag(org)
            families["baton_reconciler_lag_entries"].add_metric([org], lag.entries)
            families["baton_reconciler_lag_seconds"].add_metric([org], lag.seconds)


class Exposition(Collector):
    """What a scrape shows: the families of ``sources``, keeping only the samples of
    ``org`` (their ``organization`` label) when ``org`` is given.

    Args:
        sources: collectors to read (``Iterable[Collector]``), e.g. :func:`recorded` and a
            :class:`StoreGauges`.
        org: the organization to show (``str``), or ``None`` for every sample.
    """

    def __init__(self, sources: Iterable[Collector], org: str | None = None) -> None:
        self.sources = list(sources)
        self.org = org

    def collect(self) -> Iterator[Metric]:
        """The families of the sources, filtered to :attr:`org`."""
        for source in self.sources:
            for family in source.collect():
                if self.org is None:
                    yield family
                    continue
                kept = Metric(family.name, family.documentation, family.type, family.unit)
                kept.samples = [
                    s for s in family.samples if s.labels.get("organization") == self.org
                ]
                yield kept


def exposition(
    store: LedgerStore | None,
    authority: LeaseAuthority | None = None,
    org: str | None = None,
) -> bytes:
    """The text exposition (Prometheus format 0.0.4, ``bytes``) of the counters and
    histograms and, when ``store`` is given, the gauges; only ``org``'s samples when given.

    Raises:
        UnavailableError: never for a store that cannot be read (its gauges are left out).
    """
    sources: list[Collector] = [recorded()]
    if store is not None:
        sources.append(StoreGauges(store, authority, org))
    return generate_latest(Exposition(sources, org))


@dataclass
class Listener:
    """The loopback metrics listener started by :func:`listen`.

    Attributes:
        port: the TCP port it listens on (``int``; the one chosen when 0 was asked).
    """

    port: int
    _server: WSGIServer

    def close(self) -> None:
        """Stop listening (the serving thread ends)."""
        self._server.shutdown()
        self._server.server_close()


def listen(
    port: int, store: LedgerStore | None = None, authority: LeaseAuthority | None = None
) -> Listener:
    """Serve the text exposition of every organization, unauthenticated, on
    ``127.0.0.1:port`` (``int``, 0..65535; 0: a free port) on a daemon thread
    (prometheus_client's HTTP server). Only loopback: anyone who can connect reads it.

    Raises:
        UnavailableError: the port cannot be bound (in use, or not permitted).
    """
    sources: list[Collector] = [_Recorded()]
    if store is not None:
        sources.append(StoreGauges(store, authority))
    try:
        server, _thread = start_http_server(port, addr="127.0.0.1", registry=Exposition(sources))
    except OSError as exc:
        raise UnavailableError(
            f"cannot listen for metrics on 127.0.0.1:{port}: {exc.strerror or exc}"
        ) from exc
    return Listener(int(server.server_port), server)


class _Recorded(Collector):
    """:func:`recorded`, read anew at each scrape (the files of processes started since)."""

    def collect(self) -> Iterator[Metric]:
        yield from recorded().collect()
