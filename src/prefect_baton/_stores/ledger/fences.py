"""Fence checks of the ledger store: whether a fenced record write (a checkpoint save, an
outcome record) still holds the effective generation of the lease it presents
(:meth:`~FenceOps._check_fence`), and the resource lock the write takes for it
(:meth:`~FenceOps._fence_locks`). A write refused past the deadline of a pending handoff
carrying its lease ends that handoff, as a refused renew does
(:meth:`~FenceOps._end_carriers`)."""

from __future__ import annotations

from functools import partial

from prefect_baton._rules import core as _core
from prefect_baton._rules import events as _events
from prefect_baton._rules.core import Generation
from prefect_baton._rules.digests import resource_key
from prefect_baton._stores.ledger.base import Tx
from prefect_baton._stores.ledger.convert import row_to_generation, subject_of
from prefect_baton._stores.ledger.leases import LeaseOps
from prefect_baton._stores.protocol import Caller, Fence
from prefect_baton.errors import StaleFenceError


class FenceOps(LeaseOps):
    """The fence checks of the record writes of
    :class:`~prefect_baton._stores.ledger.records.RecordOps`."""

    def _check_fence(self, tx: Tx, fence: Fence | None, write: str) -> Generation | None:
        """Check ``fence`` in write transaction ``tx`` (the authority's generation when the
        fence has a ``check``, else the ledger's row, and only where the ledger decides the
        org's leases: :meth:`_check_ledger_authority`, since in an org Redis decides the
        ledger's copy lags and would accept a generation Redis has already ended):
        :func:`_core.check_fence`, with the deadline of a pending handoff carrying it. A refusal
        of a lease of a known resource leaves ``fence.rejected`` (naming ``write``, the
        operation) to be recorded once ``tx`` has rolled back (:attr:`Tx.on_refusal`); a
        refusal past that deadline then ends the handoff (:attr:`Tx.after_refusal`: the
        fence's ``end_carriers`` on another authority, else :meth:`_end_carriers`).

        Raises:
            StaleFenceError: the fence is not the writer's effective generation.
            ForbiddenError: no ``check`` and Redis decides the org's leases.
        """
        if fence is None:
            return None
        if fence.check is not None:
            held, now_ms = fence.check()
        else:
            self._check_ledger_authority(tx, lock=True)
            row = self._row_by_id(tx.session, tx.caller.org, fence.lease_id)
            held, now_ms = (row_to_generation(row) if row else None), tx.now_ms
        # the handoffs are the ledger's on every arm: a deadline judged on the authority's
        # clock, as the generation is
        deadline = self._carried_deadline(tx, held)
        try:
            return _core.check_fence(
                held,
                lease_id=fence.lease_id,
                epoch=fence.epoch,
                now_ms=now_ms,
                principal=tx.caller.principal,
                handoff_deadline_ms=deadline,
            )
        except StaleFenceError:
            if held is not None and _core.handoff_deadline_passed(deadline, now_ms):
                end = fence.end_carriers or partial(self._end_carriers, tx.caller, held.lease_id)
                tx.after_refusal.append(end)
            if held is None and fence.check is not None:  # Redis forgot it: the ledger's copy
                row = self._row_by_id(tx.session, tx.caller.org, fence.lease_id)
                held = row_to_generation(row) if row else None
            if held is not None:
                resource = (held.resource_type, held.resource_id)
                payload = _events.fence_rejected_payload(
                    fence.lease_id, fence.epoch, resource[0], resource[1], write
                )
                tx.on_refusal.append((_events.FENCE_REJECTED, subject_of(resource), payload))
            raise

    def _end_carriers(self, caller: Caller, lease_id: str) -> None:
        """End the expired pending handoffs carrying lease ``lease_id`` in a transaction of
        its own, as a refused renew ends them (:meth:`_end_carrier`): after a write fenced by
        it was refused past such a handoff's deadline, on the ledger's own leases.

        Raises:
            NotFoundError: the lease is unknown.
            ForbiddenError: Redis decides the org's leases.
        """

        def fn(tx: Tx, row: Generation | None, _resource: tuple[str, str]) -> None:
            self._end_carrier(tx, row, self._carried_deadline(tx, row))

        self._by_proof(caller, lease_id, fn)

    def _fence_locks(self, caller: Caller, fence: Fence | None) -> list[str]:
        if fence is None:
            return []
        if fence.resource is not None:
            return [f"res:{caller.org}:{resource_key(*fence.resource)}"]
        located = self._resource_of(caller, fence.lease_id)
        if located is None:
            return []
        return [f"res:{caller.org}:{resource_key(located[0], located[1])}"]
