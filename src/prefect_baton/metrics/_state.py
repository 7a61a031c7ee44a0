"""Whether metrics are recorded in this process, and :func:`record`, the one function every
recording goes through. Imports nothing from a metrics library: while nothing is enabled
(``SINKS`` empty), a recording site costs one attribute read.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from prefect_baton.metrics._specs import INSTRUMENTS, MAX_LABEL_TOTAL, MAX_LABEL_VALUES, OTHER

__all__ = ["SINKS", "Sink", "bounded", "enabled", "record", "set_sinks"]


class Sink(Protocol):
    """A metrics backend (Prometheus, OpenTelemetry) that :func:`record` feeds."""

    def add(self, name: str, labels: tuple[str, ...], value: float) -> None:
        """Add ``value`` to the counter ``name``, or observe it on the histogram ``name``,
        under ``labels`` (in the order of the instrument's label names)."""


#: The enabled backends (empty: nothing is recorded). Replaced whole, never mutated.
SINKS: tuple[Sink, ...] = ()

#: The label values seen so far, by (label, organization); for ``organization`` itself the
#: organization is ``""``.
_seen: dict[tuple[str, str], set[str]] = {}
_totals: dict[str, int] = dict.fromkeys(MAX_LABEL_VALUES, 0)
_seen_lock = threading.Lock()


def enabled() -> bool:
    """Whether anything records metrics in this process (``bool``)."""
    return bool(SINKS)


def bounded(label: str, value: str, organization: str = "") -> str:
    """``value`` (``str``) of the label ``label`` (``str``), or
    :data:`~prefect_baton.metrics._specs.OTHER` once
    :data:`~prefect_baton.metrics._specs.MAX_LABEL_VALUES` other values of that label were
    seen in this process for ``organization`` (``str``; ``""`` for the ``organization``
    label itself), or :data:`~prefect_baton.metrics._specs.MAX_LABEL_TOTAL` over all
    organizations. Labels without a cap pass unchanged."""
    cap = MAX_LABEL_VALUES.get(label)
    if cap is None:
        return value
    seen = _seen.get((label, organization))
    if seen is not None and value in seen:
        return value
    with _seen_lock:
        seen = _seen.setdefault((label, organization), set())
        if value in seen:
            return value
        if len(seen) >= cap or _totals[label] >= MAX_LABEL_TOTAL[label]:
            return OTHER
        seen.add(value)
        _totals[label] += 1
    return value


def forget_label_values() -> None:
    """Forget the label values seen so far, so that the caps of :func:`bounded` count from
    zero again (for test suites, which make thousands of organizations in one process)."""
    with _seen_lock:
        _seen.clear()
        for label in _totals:
            _totals[label] = 0


def record(name: str, organization: str, *labels: str, value: float = 1.0) -> None:
    """Record ``value`` (default 1, a count; seconds for a histogram) on the instrument
    ``name`` of :data:`~prefect_baton.metrics._specs.INSTRUMENTS` for ``organization`` and
    the instrument's further ``labels`` in order (a ``resource_type`` second, when the
    instrument has one). Does nothing when no backend is enabled.

    Never raises: a recording follows the call it measures, often a committed write, and a
    backend's failure (prometheus_client's multiprocess directory removed or unwritable, a
    full disk) must not turn that call into an error the caller would retry. A failure is
    logged (``prefect_baton.metrics``, warning, with its traceback) the first time for each
    backend and kind of error, and the value is dropped."""
    sinks = SINKS
    if not sinks:
        return
    org = bounded("organization", organization)
    rest = labels
    if labels and name not in _NO_RESOURCE_TYPE:
        rest = (bounded("resource_type", labels[0], org), *labels[1:])
    for sink in sinks:
        try:
            sink.add(name, (org, *rest), value)
        except Exception as exc:
            _report_failure(sink, exc)


_log = logging.getLogger("prefect_baton.metrics")
#: (backend class, error class) pairs already logged by :func:`_report_failure`.
_failures_logged: set[tuple[str, str]] = set()


def _report_failure(sink: Sink, exc: Exception) -> None:
    kind = (type(sink).__qualname__, type(exc).__qualname__)
    if kind in _failures_logged:
        return
    _failures_logged.add(kind)
    _log.warning(
        "metrics backend %s failed (%s); values it cannot record are dropped, the calls they "
        "measure are not affected (logged once per kind of error)",
        kind[0],
        kind[1],
        exc_info=exc,
    )


_NO_RESOURCE_TYPE = frozenset(n for n, i in INSTRUMENTS.items() if "resource_type" not in i.labels)


def set_sinks(sinks: tuple[Sink, ...]) -> None:
    """Replace the enabled backends (``()``: stop recording)."""
    global SINKS
    SINKS = sinks
