"""Shared pieces of the client surface: argument coercion and the API base class."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from ._authority import Caller
from ._keeper import LeaseKeeper
from ._ledger.store import Fence, LedgerStore
from .errors import ValidationError
from .models import Lease

if TYPE_CHECKING:
    from ._client import Baton

T = TypeVar("T")

HANDOFF_RESOLUTIONS = ("accepted", "rejected")
OUTCOME_STATUSES = ("succeeded", "failed", "cancelled")
CHECKPOINT_TTL_MAX_SECONDS = 366 * 86_400


@runtime_checkable
class FenceLike(Protocol):
    """Anything that names a lease generation: a :class:`Lease` or a :class:`LeaseKeeper`."""

    @property
    def lease_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...


LeaseLike = Lease | LeaseKeeper


def _lease_of(lease: object) -> Lease:
    if isinstance(lease, LeaseKeeper):
        return lease.lease
    if isinstance(lease, Lease):
        return lease
    raise ValidationError(f"expected a Lease, got {type(lease).__name__}")


def _fence_of(fence: object) -> Fence | None:
    if fence is None:
        return None
    if isinstance(fence, Lease | LeaseKeeper):
        return Fence(fence.lease_id, fence.epoch)
    raise ValidationError(f"fence must be a Lease (or the lease block), got {type(fence).__name__}")


def _limit(limit: object, maximum: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise ValidationError(f"limit must be an integer from 1 to {maximum}")
    return limit


class _API:
    def __init__(self, baton: Baton) -> None:
        self._b = baton

    @property
    def _caller(self) -> Caller:
        return self._b.caller

    @property
    def _store(self) -> LedgerStore:
        self._b._ledger_barrier()
        return self._b.store
