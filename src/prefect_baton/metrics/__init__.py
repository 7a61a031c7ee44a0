"""Metrics of prefect-baton: counters and histograms recorded as leases, renewals,
releases, handoffs and fenced writes happen, and gauges computed from the ledger when
scraped (``docs/operations.md`` lists each with its labels and unit).

Recording is off until :func:`enable` is called (``baton serve`` enables it for its
process); until then a recording site costs one attribute read, and importing
:mod:`prefect_baton` does not import ``prometheus_client``. Labels carry only the
organization, the resource type and a bounded result, status, reason or kind: never
resource ids, lease ids, principals or keys. A process records at most
:data:`~prefect_baton.metrics._specs.MAX_LABEL_VALUES` organizations and resource types per
organization, and :data:`~prefect_baton.metrics._specs.MAX_LABEL_TOTAL` in all (then
``_other``).

Operations are recorded where they are decided: by a client on the ledger or on Redis, and
by ``baton serve`` for its REST callers. A client over the REST API (``api_url``) records
no operation of its own (its server does), only the losses its lease blocks find.

Example::

    from prefect_baton import Baton, metrics

    b = Baton(org="acme", principal="agent-a")
    listener = metrics.enable(port=9464, baton=b)  # http://127.0.0.1:9464/metrics
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect_baton.errors import ValidationError
from prefect_baton.metrics import _state
from prefect_baton.metrics._specs import GAUGES, INSTRUMENTS, Instrument

if TYPE_CHECKING:
    from prefect_baton._client.sync import Baton
    from prefect_baton.metrics._prom import Listener

__all__ = [
    "GAUGES",
    "INSTRUMENTS",
    "Instrument",
    "disable",
    "enable",
    "enabled",
    "exposition",
    "registry",
]

enabled = _state.enabled


def enable(
    port: int | None = None,
    *,
    baton: Baton | None = None,
    otel: bool = False,
    meter_provider: Any = None,
) -> Listener | None:
    """Record metrics in this process from now on (Prometheus, into the module's own
    registry; and through OpenTelemetry when ``otel``). Calling it again adds what was not
    enabled yet; it never records anything twice.

    Args:
        port: also serve the text exposition, unauthenticated, on ``127.0.0.1:port``
            (``int``, 0..65535; 0 picks a free port; ``None``: no listener): counters and
            histograms of every organization and, with ``baton``, the gauges.
        baton: a client on the ledger whose gauges (effective leases, pending handoffs,
            reconciler lag) the listener computes at each scrape, for every organization
            of that ledger (``None``: no gauges).
        otel: also record through the OpenTelemetry metrics API (``bool``); needs
            ``opentelemetry-api`` (``pip install 'prefect-baton[otel]'``). The gauges are
            not offered through OpenTelemetry.
        meter_provider: with ``otel``, the ``MeterProvider`` to use (default: the global
            one of ``opentelemetry.metrics``).

    Returns:
        The :class:`~prefect_baton.metrics._prom.Listener` (its ``port``, ``close()``)
        when ``port`` was given, else ``None``.

    Raises:
        ValidationError: ``port`` is not an integer from 0 to 65535; ``otel`` without
            ``opentelemetry-api`` installed.
        ForbiddenError: ``baton`` is a REST API client (it has no ledger to count).
        UnavailableError: ``port`` cannot be bound.
    """
    from prefect_baton.metrics._prom import PrometheusSink, listen

    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
    ):
        raise ValidationError(f"the metrics port must be an integer from 0 to 65535, got {port!r}")
    sinks = list(_state.SINKS)
    if not any(isinstance(s, PrometheusSink) for s in sinks):
        sinks.append(PrometheusSink())
    if otel:
        from prefect_baton.metrics._otel import OtelSink

        try:
            sink = OtelSink(meter_provider)
        except ImportError:
            raise ValidationError(
                "otel=True needs opentelemetry-api: pip install 'prefect-baton[otel]'"
            ) from None
        sinks = [s for s in sinks if not isinstance(s, OtelSink)] + [sink]
    store = baton.store if baton is not None else None
    _state.set_sinks(tuple(sinks))
    if port is None:
        return None
    return listen(port, store, baton.authority if baton is not None else None)


def registry() -> Any:
    """The ``prometheus_client.CollectorRegistry`` holding prefect-baton's counters and
    histograms (its own, not prometheus_client's global one), e.g. to serve them with your
    application's exporter. With ``PROMETHEUS_MULTIPROC_DIR`` set, read the directory with
    ``prometheus_client.multiprocess.MultiProcessCollector`` instead."""
    from prefect_baton.metrics._prom import REGISTRY

    return REGISTRY


def disable() -> None:
    """Stop recording (the values recorded so far stay in the registry)."""
    _state.set_sinks(())


def exposition(baton: Baton | None = None, org: str | None = None) -> bytes:
    """The text exposition (Prometheus format, ``bytes``) of what was recorded in this
    process, with the gauges of ``baton``'s ledger when given; only ``org``'s samples
    when ``org`` is given.

    Raises:
        ForbiddenError: ``baton`` is a REST API client (it has no ledger).
    """
    from prefect_baton.metrics._prom import exposition as _exposition

    if baton is None:
        return _exposition(None, None, org)
    return _exposition(baton.store, baton.authority, org)
