"""AsyncBaton mirrors Baton: every public method of each sync API class has a coroutine twin
with the same parameters (names, kinds, defaults, annotations), and the async client works
on the SQLite ledger (operations, ``async with ab.lease(...)``, ``async with AsyncBaton``)."""

from __future__ import annotations

import asyncio
import inspect
import threading
import typing
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from prefect_baton import (
    AsyncBaton,
    AsyncCheckpointAPI,
    AsyncEventAPI,
    AsyncHandoffAPI,
    AsyncLeaseAPI,
    AsyncOutcomeAPI,
    Baton,
    CheckpointAPI,
    ConflictError,
    EventAPI,
    HandoffAPI,
    LeaseAPI,
    OutcomeAPI,
    ValidationError,
)
from prefect_baton._client.api_base import _API

PAIRS: list[tuple[type, type]] = [
    (LeaseAPI, AsyncLeaseAPI),
    (CheckpointAPI, AsyncCheckpointAPI),
    (HandoffAPI, AsyncHandoffAPI),
    (OutcomeAPI, AsyncOutcomeAPI),
    (EventAPI, AsyncEventAPI),
]
# Baton members that AsyncBaton offers under another name, or not at all (with why).
RENAMED = {"close": "aclose"}
NOT_ON_ASYNC = {"store": "the sync ledger store; reach it as ab.sync.store"}


def public(cls: type, kind: type) -> dict[str, Any]:
    """The public members of ``cls`` (own and inherited) stored as ``kind`` (a function,
    property or classmethod), by name."""
    found: dict[str, Any] = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        static = inspect.getattr_static(cls, name)
        if isinstance(static, kind):
            found[name] = getattr(cls, name)
    return found


def methods(cls: type) -> dict[str, Any]:
    return public(cls, type(lambda: None))


def same_parameters(sync_fn: Callable[..., Any], async_fn: Callable[..., Any]) -> None:
    """Same names, kinds, defaults and annotations (as written and as resolved types)."""
    sync_sig, async_sig = inspect.signature(sync_fn), inspect.signature(async_fn)
    assert list(async_sig.parameters.values()) == list(sync_sig.parameters.values())
    sync_hints = typing.get_type_hints(sync_fn)
    async_hints = typing.get_type_hints(async_fn)
    sync_hints.pop("return", None)
    async_hints.pop("return", None)
    assert async_hints == sync_hints


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_async_api_mirrors_sync_api(sync_cls: type, async_cls: type) -> None:
    """Each public method of the sync API class has a coroutine twin with the same
    parameters and result type, and the async class has nothing else."""
    sync_methods, async_methods = methods(sync_cls), methods(async_cls)
    assert sorted(async_methods) == sorted(sync_methods)
    assert sync_methods, f"{sync_cls.__name__} has no public methods?"
    for name, sync_fn in sync_methods.items():
        async_fn = async_methods[name]
        assert inspect.iscoroutinefunction(async_fn), f"{async_cls.__name__}.{name}"
        same_parameters(sync_fn, async_fn)
        sync_return = typing.get_type_hints(sync_fn)["return"]
        assert typing.get_type_hints(async_fn)["return"] == sync_return
        assert async_fn.__doc__ == sync_fn.__doc__


def test_async_baton_mirrors_baton() -> None:
    """AsyncBaton has Baton's methods (blocking ones as coroutines, ``lease`` and
    ``as_principal`` as plain calls), class methods and properties, and nothing else."""
    sync_methods, async_methods = methods(Baton), methods(AsyncBaton)
    expected = {RENAMED.get(n, n) for n in sync_methods}
    assert sorted(async_methods) == sorted(expected)
    for name, sync_fn in sync_methods.items():
        async_fn = async_methods[RENAMED.get(name, name)]
        same_parameters(sync_fn, async_fn)
    for name in ("prune_receipts", "aclose"):
        assert inspect.iscoroutinefunction(async_methods[name]), name
    for name in ("lease", "as_principal"):
        assert not inspect.iscoroutinefunction(async_methods[name]), name
    assert typing.get_type_hints(AsyncBaton.lease) == typing.get_type_hints(Baton.lease)
    assert typing.get_type_hints(AsyncBaton.as_principal)["return"] is AsyncBaton

    classmethods = public(Baton, classmethod)
    assert sorted(public(AsyncBaton, classmethod)) == sorted(classmethods)
    for name, sync_fn in classmethods.items():
        same_parameters(sync_fn, getattr(AsyncBaton, name))

    properties = set(public(Baton, property)) - set(NOT_ON_ASYNC)
    assert set(public(AsyncBaton, property)) == properties


# --------------------------------------------------------------------------- behaviour


@pytest.fixture
def ledger_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def org() -> str:
    return f"org-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def baton(ledger_url: str, org: str) -> Iterator[Baton]:
    b = Baton(ledger_url=ledger_url, org=org, principal="agent-a")
    yield b
    b.close()


def test_every_api_group_has_its_async_twin(baton: Baton) -> None:
    """Every operation group of a Baton (``b.leases`` ...) is on the AsyncBaton under the
    same name, as the async class of its PAIRS entry, running that very sync object."""
    ab = AsyncBaton(sync=baton)
    twins = dict(PAIRS)
    groups = {name: api for name, api in vars(baton).items() if isinstance(api, _API)}
    assert set(groups) == {"leases", "checkpoints", "handoffs", "outcomes", "events"}
    for name, api in groups.items():
        twin = getattr(ab, name)
        assert type(twin) is twins[type(api)]
        assert twin.sync is api


def test_acquire_renew_release(baton: Baton) -> None:
    """Async acquire, renew and release change the ledger as the sync calls do, and raise
    the same errors."""
    ab = AsyncBaton(sync=baton)
    other = ab.as_principal("agent-b")

    async def main() -> None:
        lease = await ab.leases.acquire("deploy", "svc", ttl_seconds=30)
        assert lease.owner == "agent-a"
        with pytest.raises(ConflictError):
            await other.leases.acquire("deploy", "svc", ttl_seconds=30)
        with pytest.raises(ValidationError):
            await ab.leases.acquire("deploy", "svc", ttl_seconds=1)
        renewed = await ab.leases.renew(lease, ttl_seconds=60)
        assert renewed.lease_id == lease.lease_id
        assert renewed.version == lease.version + 1
        assert (await ab.leases.inspect("deploy", "svc")).held
        receipt = await ab.leases.release(renewed)
        assert receipt.status == "released"
        assert not (await ab.leases.inspect("deploy", "svc")).held

    asyncio.run(main())
    assert not baton.leases.inspect("deploy", "svc").held


def test_checkpoint_save_and_get(baton: Baton) -> None:
    """An async checkpoint save (fenced by a lease) is read back by an async get."""
    ab = AsyncBaton(sync=baton)

    async def main() -> None:
        assert await ab.checkpoints.get("svc", "plan") is None
        lease = await ab.leases.acquire("deploy", "svc", ttl_seconds=30)
        saved = await ab.checkpoints.save("svc", "plan", {"step": 1}, fence=lease)
        got = await ab.checkpoints.get("svc", "plan")
        assert got is not None
        assert got.checkpoint_id == saved.checkpoint_id
        assert got.state == {"step": 1}
        await ab.leases.release(lease)

    asyncio.run(main())
    got = baton.checkpoints.get("svc", "plan")
    assert got is not None
    assert got.state == {"step": 1}


def test_async_lease_block(baton: Baton) -> None:
    """``async with ab.lease(...)`` holds the lease inside the block (usable as a fence)
    and releases it on exit."""
    ab = AsyncBaton(sync=baton)

    async def main() -> str:
        async with ab.lease("deploy", "svc", ttl_seconds=30) as held:
            info = await ab.leases.inspect("deploy", "svc")
            assert info.lease is not None
            assert info.lease.lease_id == held.lease_id
            await ab.checkpoints.save("svc", "plan", {"step": 2}, fence=held)
        return held.receipt_status or ""

    assert asyncio.run(main()) == "released"
    assert not baton.leases.inspect("deploy", "svc").held


def test_calls_run_on_a_worker_thread(baton: Baton, monkeypatch: pytest.MonkeyPatch) -> None:
    """The blocking sync method runs off the event loop's thread, and is looked up on the
    wrapped object (an override or patch of it is what runs)."""
    ab = AsyncBaton(sync=baton)
    threads: list[int] = []
    original = baton.leases.inspect

    def spy(resource_type: str, resource_id: str) -> Any:
        threads.append(threading.get_ident())
        return original(resource_type, resource_id)

    monkeypatch.setattr(baton.leases, "inspect", spy)

    async def main() -> int:
        await ab.leases.inspect("deploy", "svc")
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert len(threads) == 1
    assert threads[0] != loop_thread


def test_async_with_closes_the_client(ledger_url: str, org: str) -> None:
    """``async with AsyncBaton(...) as ab`` yields the client and closes its Baton on exit,
    also when the body raises."""
    closed: list[str] = []

    def spy_close(ab: AsyncBaton, label: str) -> None:
        close = ab.sync.close

        def spy() -> None:
            closed.append(label)
            close()

        ab.sync.close = spy  # type: ignore[method-assign]

    async def main() -> None:
        async with AsyncBaton(ledger_url, org, "agent-a") as ab:
            spy_close(ab, "ok")
            lease = await ab.leases.acquire("deploy", "svc", ttl_seconds=30)
            await ab.leases.release(lease)
        assert closed == ["ok"]
        with pytest.raises(RuntimeError, match="body failed"):
            await failing_body()
        assert closed == ["ok", "raised"]

    async def failing_body() -> None:
        async with AsyncBaton(ledger_url, org, "agent-a") as ab:
            spy_close(ab, "raised")
            raise RuntimeError("body failed")

    asyncio.run(main())
