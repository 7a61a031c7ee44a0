"""The OpenTelemetry backend: the same counters and histograms as
:data:`~prefect_baton.metrics._specs.INSTRUMENTS` through an OpenTelemetry ``Meter``, for a
process that already exports OpenTelemetry metrics (``pip install 'prefect-baton[otel]'``
for the API; the SDK and exporter are the application's)."""

from __future__ import annotations

from typing import Any

from prefect_baton.metrics._specs import INSTRUMENTS

__all__ = ["OtelSink"]


class OtelSink:
    """Records through the meter ``prefect_baton`` of ``meter_provider`` (default: the
    global provider of ``opentelemetry.metrics``); a
    :class:`~prefect_baton.metrics._state.Sink`.

    Args:
        meter_provider: an OpenTelemetry ``MeterProvider`` (``None``: the global one).

    Raises:
        ImportError: ``opentelemetry-api`` is not installed.
    """

    def __init__(self, meter_provider: Any = None) -> None:
        from opentelemetry import metrics

        provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        meter = provider.get_meter("prefect_baton")
        self._instruments: dict[str, Any] = {}
        for spec in INSTRUMENTS.values():
            unit = "s" if spec.unit == "seconds" else "1"
            if spec.kind == "counter":
                self._instruments[spec.name] = meter.create_counter(spec.name, unit, spec.help)
            else:
                self._instruments[spec.name] = meter.create_histogram(spec.name, unit, spec.help)

    def add(self, name: str, labels: tuple[str, ...], value: float) -> None:
        """Add ``value`` to counter ``name`` or record it on histogram ``name``, with the
        instrument's label names as attributes."""
        attributes = dict(zip(INSTRUMENTS[name].labels, labels, strict=True))
        instrument = self._instruments[name]
        if INSTRUMENTS[name].kind == "counter":
            instrument.add(value, attributes)
        else:
            instrument.record(value, attributes)
