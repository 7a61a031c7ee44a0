"""``baton reconcile`` drains the Redis journal into the ledger and reports progress."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from sqlalchemy import func, select

from prefect_baton import Baton
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.ledger.tables import LeaseTransition
from prefect_baton._stores.redis.authority import RedisAuthority

from ..conftest import REDIS_URL, require_redis


def _transitions(store: LedgerStore, org: str) -> int:
    with store._read() as (s, _now):
        q = select(func.count()).select_from(LeaseTransition).where(LeaseTransition.org_id == org)
        return int(s.execute(q).scalar_one())


def test_reconcile_drains_the_journal_with_plain_progress_when_piped(tmp_path: Path) -> None:
    """Transitions held only in the Redis journal reach the ledger after `baton reconcile`;
    piped, it reports progress as plain lines on stderr and a JSON receipt on stdout."""
    require_redis()
    ledger = f"sqlite:///{tmp_path / 'l.db'}"
    org = f"rec-{uuid.uuid4().hex[:8]}"
    store = LedgerStore(ledger)
    authority = RedisAuthority.from_url(REDIS_URL, store, ack="redis", reconcile_in_client=False)
    b = Baton(org=org, principal="a", store=store, lease_authority=authority)
    for i in range(5):
        lease = b.leases.acquire("file", f"f{i}", ttl_seconds=30)
        b.leases.release(lease)
    assert _transitions(store, org) == 0
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect_baton.cli",
            "--ledger-url",
            ledger,
            "--redis-url",
            REDIS_URL,
            "--org",
            org,
            "reconcile",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"reconcile: {org}: applied" in proc.stderr
    assert _transitions(store, org) == 10
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect_baton.cli",
            "--ledger-url",
            ledger,
            "--redis-url",
            REDIS_URL,
            "--org",
            org,
            "--format",
            "json",
            "reconcile",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = json.loads(proc.stdout)
    assert out["ok"] is True
    assert out["reconcile"]["lag"][org]["entries"] == 0
    authority.close()
    store.close()


def test_reconcile_into_a_missing_sqlite_ledger_drains_nothing(tmp_path: Path) -> None:
    """A mistyped --ledger-url must not take the journal out of Redis into a new, empty
    file: `baton reconcile` exits 5 (NOT_FOUND) naming the path, creates no file, and the
    journal entries stay for the real ledger, which a later run drains."""
    require_redis()
    ledger = f"sqlite:///{tmp_path / 'l.db'}"
    typo = tmp_path / "typo" / "l.db"
    org = f"rec-{uuid.uuid4().hex[:8]}"
    store = LedgerStore(ledger)
    authority = RedisAuthority.from_url(REDIS_URL, store, ack="redis", reconcile_in_client=False)
    b = Baton(org=org, principal="a", store=store, lease_authority=authority)
    b.leases.release(b.leases.acquire("file", "f", ttl_seconds=30))

    def run(url: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "prefect_baton.cli", "--format", "json", "--ledger-url",
             url, "--redis-url", REDIS_URL, "--org", org, "reconcile"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    proc = run(f"sqlite:///{typo}")
    assert proc.returncode == 5, proc.stderr
    assert json.loads(proc.stdout)["error"]["code"] == "NOT_FOUND"
    assert str(typo) in json.loads(proc.stdout)["error"]["message"]
    assert not typo.exists()
    assert not typo.parent.exists()
    assert _transitions(store, org) == 0
    assert run(ledger).returncode == 0
    assert _transitions(store, org) == 2


def test_return_to_ledger_into_a_missing_sqlite_ledger_changes_nothing(tmp_path: Path) -> None:
    """`baton reconcile --return-to-ledger` with a mistyped SQLite path exits 5 (NOT_FOUND)
    and leaves the org with Redis: its leases still answer through Redis."""
    require_redis()
    ledger = f"sqlite:///{tmp_path / 'l.db'}"
    typo = tmp_path / "typo.db"
    org = f"rec-{uuid.uuid4().hex[:8]}"
    b = Baton(ledger_url=ledger, redis_url=REDIS_URL, org=org, principal="a")
    lease = b.leases.acquire("file", "f", ttl_seconds=30)
    proc = subprocess.run(
        [sys.executable, "-m", "prefect_baton.cli", "--format", "json", "--ledger-url",
         f"sqlite:///{typo}", "--redis-url", REDIS_URL, "--org", org, "reconcile",
         "--return-to-ledger"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 5, proc.stderr
    assert json.loads(proc.stdout)["error"]["code"] == "NOT_FOUND"
    assert not typo.exists()
    assert b.leases.renew(lease, ttl_seconds=30).version == lease.version + 1
    b.close()
