"""The background drainer's log while a drain keeps failing (Redis or the ledger down)."""

from __future__ import annotations

import logging
import threading
from typing import Any, cast

import pytest

from prefect_baton._stores.redis.reconciler import Drainer, Reconciler


class _Flaky:
    """Stands in for a :class:`Reconciler`: the first ``fails`` drains raise, then they
    drain nothing."""

    batch_size = 100

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.calls = 0
        self.recovered = threading.Event()

    def drain(self, org: str, max_batches: int) -> int:
        self.calls += 1
        if self.calls <= self.fails:
            raise ConnectionError(f"redis down ({self.calls})")
        self.recovered.set()
        return 0


def test_a_run_of_failed_drains_warns_once_then_says_it_recovered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Four failed drains in a row log one warning (the rest at debug level), and the
    first drain that works again says so with the count; before, every failed attempt
    was a warning, one every 5 s for as long as Redis was down."""
    flaky = _Flaky(fails=4)
    caplog.set_level(logging.DEBUG, logger="prefect_baton")
    drainer = Drainer(cast(Reconciler, cast(Any, flaky)))
    try:
        drainer.add("acme")
        assert flaky.recovered.wait(30)
    finally:
        drainer.stop()
    mine = [r for r in caplog.records if "background reconcile of acme" in r.getMessage()]
    warnings = [r.getMessage() for r in mine if r.levelno == logging.WARNING]
    assert warnings == [
        "background reconcile of acme failed: redis down (1)",
        "background reconcile of acme works again after 4 failed attempts",
    ]
    assert sum(r.levelno == logging.DEBUG for r in mine) == 3
