"""Shared pieces of the client surface: argument coercion and the API base class."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from prefect_baton._client.keeper import LeaseKeeper
from prefect_baton._rules.core import Proof
from prefect_baton._stores.ledger.store import Fence
from prefect_baton._stores.protocol import Caller
from prefect_baton.errors import ValidationError
from prefect_baton.models import Checkpoint, Event, Evidence, Handoff, Lease, Outcome

if TYPE_CHECKING:
    from prefect_baton._client.sync import Baton
    from prefect_baton._stores.rest.client import RemoteBackend

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

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


class RecordStore(Protocol):
    """The store operations the client surface calls besides the lease authority's: the
    ledger (:class:`~prefect_baton._stores.ledger.store.LedgerStore`) or the REST API
    (:class:`~prefect_baton._stores.rest.client.RemoteBackend`). Arguments arrive validated; every
    method raises the :mod:`prefect_baton.errors` of its rule."""

    @property
    def state_max_bytes(self) -> int: ...

    def checkpoint_save(
        self,
        caller: Caller,
        subject_id: str,
        kind: str,
        state: dict[str, Any],
        *,
        state_text: str,
        state_hash: str,
        expected_version: int | None,
        fence: Fence | None,
        idempotency_key: str | None,
        ttl_ms: int | None,
    ) -> Checkpoint: ...

    def checkpoint_get(
        self, caller: Caller, subject_id: str, kind: str, principal: str | None = None
    ) -> Checkpoint | None: ...

    def checkpoint_get_by_id(self, caller: Caller, checkpoint_id: str) -> Checkpoint: ...

    def checkpoint_history(
        self, caller: Caller, subject_id: str, kind: str, principal: str | None = None
    ) -> list[Checkpoint]: ...

    def handoff_create(
        self,
        caller: Caller,
        to_principal: str,
        subject_id: str,
        *,
        checkpoint_id: str | None,
        context_id: str | None,
        message: str | None,
        lease: Proof | None,
        expires_in_ms: int | None,
        idempotency_key: str | None,
    ) -> Handoff: ...

    def handoff_inbox(self, caller: Caller, *, limit: int = 100) -> list[Handoff]: ...

    def handoff_get(self, caller: Caller, handoff_id: str) -> Handoff: ...

    def handoff_resolve(
        self,
        caller: Caller,
        handoff_id: str,
        status: str,
        *,
        note: str | None,
        execution_key: str | None,
        ttl_ms: int | None,
    ) -> Handoff: ...

    def outcome_record(
        self,
        caller: Caller,
        subject_id: str,
        status: str,
        *,
        evidence: Sequence[Evidence],
        fence: Fence | None,
        lease_id: str | None,
        handoff_id: str | None,
        checkpoint_id: str | None,
        idempotency_key: str | None,
    ) -> Outcome: ...

    def outcome_list(
        self, caller: Caller, subject_id: str | None = None, *, limit: int = 1000
    ) -> list[Outcome]: ...

    def events_list(
        self, caller: Caller, *, after_seq: int = 0, limit: int = 100, kind: str | None = None
    ) -> list[Event]: ...

    def report_expired(self, caller: Caller, *, limit: int = 1000) -> list[Lease]: ...

    def prune_receipts(self, caller: Caller) -> int: ...

    def close(self) -> None: ...


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
    def _store(self) -> RecordStore:
        self._b._ledger_barrier()
        return self._b._records

    def _once(
        self,
        operation: str,
        key: str | None,
        scope: str,
        fields: Mapping[str, object],
        model: type[M],
        run: Callable[[], M],
        remote_run: Callable[[RemoteBackend, str], M],
    ) -> M:
        """``run()`` under the idempotency receipt of ``key`` in the ledger (see
        :func:`prefect_baton._stores.ledger.receipts.run_once`); plain ``run()`` without a key.
        The operation itself goes through the authority as without a key (with Redis, the
        ledger barrier/drain rules of the operation are unchanged); the receipt
        transactions touch only the receipts table. On a remote client a keyed call is
        ``remote_run(backend, key)``: the REST server keeps the receipt."""
        if key is None:
            return run()
        remote = self._b._remote
        if remote is not None:
            return remote_run(remote, key)
        from prefect_baton._stores.ledger.receipts import run_once

        return run_once(self._b.store, self._caller, operation, key, scope, fields, model, run)
