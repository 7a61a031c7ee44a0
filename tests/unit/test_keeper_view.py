"""The lease block reads as its current lease: each lease attribute it offers is the lease's
attribute of that name, with the lease's type, and reading one before the block is entered
raises RuntimeError."""

from __future__ import annotations

import inspect
import typing
import uuid
from pathlib import Path

import pytest

from prefect_baton import Baton, Lease, LeaseKeeper
from prefect_baton._client.keeper import _LeaseView

VIEWS = {
    name: value
    for name, value in vars(LeaseKeeper).items()
    if isinstance(inspect.getattr_static(LeaseKeeper, name), _LeaseView)
}


def test_each_view_is_a_lease_field_of_the_same_type() -> None:
    """The block has a view of every field of Lease, typed as that field."""
    assert set(VIEWS) == set(Lease.model_fields)
    fields = typing.get_type_hints(Lease)
    for name, view in VIEWS.items():
        (declared,) = typing.get_args(view.__orig_class__)
        assert declared == fields[name], name


def test_views_read_the_current_lease(tmp_path: Path) -> None:
    """Inside the block each view equals the current lease's attribute; before the block
    is entered reading one raises RuntimeError."""
    b = Baton(ledger_url=f"sqlite:///{tmp_path / 'l.db'}", org=f"o-{uuid.uuid4().hex[:8]}")
    try:
        block = b.lease("deploy", "svc", ttl_seconds=30, idempotency_key="run-1")
        with pytest.raises(RuntimeError, match="enter the block first"):
            _ = block.epoch
        with block as held:
            for name in VIEWS:
                assert getattr(held, name) == getattr(held.lease, name), name
            assert held.execution_key == "run-1"
            assert (held.resource_type, held.resource_id) == ("deploy", "svc")
    finally:
        b.close()
