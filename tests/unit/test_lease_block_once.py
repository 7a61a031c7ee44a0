"""A lease block is single use: ``with b.lease(...)``, ``async with ab.lease(...)`` and
``with lease(...)`` of ``prefect_baton.prefect`` refuse a second entry, nested in the block
or after it ended, with the same RuntimeError, before anything is acquired or released (a
nested entry used to release the lease under the outer block, letting another principal
take it while the outer block kept working)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefect_baton import AsyncBaton, Baton, ConflictError
from prefect_baton.prefect import lease

ONCE = r"block can be entered once; call Baton\.lease\(\) again"


@pytest.fixture
def baton(tmp_path: Path) -> Iterator[Baton]:
    b = Baton(
        ledger_url=f"sqlite:///{tmp_path / 'l.db'}",
        org=f"o-{uuid.uuid4().hex[:8]}",
        principal="alice",
    )
    try:
        yield b
    finally:
        b.close()


def _held_by_alice(b: Baton, epoch: int) -> None:
    info = b.leases.inspect("job", "x")
    assert info.held
    assert info.epoch == epoch
    assert info.lease is not None
    assert info.lease.owner == "alice"
    with pytest.raises(ConflictError):  # bob cannot take it
        b.as_principal("bob").leases.acquire("job", "x", ttl_seconds=30)


def test_nested_entry_is_refused_and_the_lease_stays_held(baton: Baton) -> None:
    held = baton.lease("job", "x", ttl_seconds=30)
    with held:
        with pytest.raises(RuntimeError, match=ONCE), held:
            pass  # not reached
        _held_by_alice(baton, 1)
        assert held.receipt_status is None
    assert held.receipt_status == "released"
    assert not baton.leases.inspect("job", "x").held


def test_entry_after_exit_is_refused(baton: Baton) -> None:
    held = baton.lease("job", "x", ttl_seconds=30)
    with held:
        pass
    with pytest.raises(RuntimeError, match=ONCE), held:
        pass  # not reached
    info = baton.leases.inspect("job", "x")
    assert not info.held
    assert info.epoch == 1
    with pytest.raises(RuntimeError, match=ONCE):
        held.start()


def test_async_nested_entry_is_refused(baton: Baton) -> None:
    ab = AsyncBaton(sync=baton)

    async def main() -> None:
        held = ab.lease("job", "x", ttl_seconds=30)
        async with held:
            with pytest.raises(RuntimeError, match=ONCE):
                async with held:
                    pass  # not reached
            _held_by_alice(baton, 1)
        with pytest.raises(RuntimeError, match=ONCE):
            async with held:
                pass  # not reached

    asyncio.run(main())
    assert not baton.leases.inspect("job", "x").held


def test_prefect_lease_block_says_the_same(baton: Baton) -> None:
    """``prefect_baton.prefect.lease`` refuses the same way, with its own call named."""
    block = lease("job", "x", ttl_seconds=30, baton=baton)
    with block:
        with (
            pytest.raises(RuntimeError, match=r"a lease\(\.\.\.\) block can be entered once"),
            block,
        ):
            pass  # not reached
        _held_by_alice(baton, 1)
    with pytest.raises(RuntimeError, match=r"call lease\(\) again"), block:
        pass  # not reached
