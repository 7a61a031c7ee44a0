"""A lease block whose renewals are blocked by an unresponsive ledger still reports the loss
at the TTL and ends within a bounded time."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from prefect_baton import Baton, LeaseLostError


@pytest.mark.slow
def test_blocked_renewal_is_lost_at_ttl_and_exit_does_not_hang(tmp_path: Path) -> None:
    """While another connection holds the SQLite file exclusively past the TTL, `held.lost`
    turns true once the TTL has run out and leaving the block raises LEASE_LOST instead of
    waiting for the blocked renewal."""
    db = tmp_path / "l.db"
    b = Baton(ledger_url=f"sqlite:///{db}", org="o", principal="a")
    locked = threading.Event()
    release = threading.Event()

    def hog() -> None:
        conn = sqlite3.connect(db, timeout=0.1, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        locked.set()
        release.wait(60)
        conn.execute("ROLLBACK")
        conn.close()

    t = threading.Thread(target=hog, daemon=True)
    with (  # noqa: PT012
        pytest.raises(LeaseLostError),
        b.lease("r", "x", ttl_seconds=10, renew_every_seconds=1.0) as held,
    ):
        t.start()
        assert locked.wait(5)
        deadline = time.monotonic() + 25
        while not held.lost and time.monotonic() < deadline:
            time.sleep(0.2)
        assert held.lost
    release.set()
    t.join(10)
    b.close()
