"""The keyed lease operations of an authority whose idempotency receipts a ledger keeps.

Renew, transfer, release (by proof and by id), force release and handoff resolve keep no
receipt inside the operation itself: :func:`~prefect_baton._stores.ledger.receipts.run_once`
keeps it in a ledger around the operation. Two authorities do so, the SQL ledger
(:class:`~prefect_baton._stores.ledger.store.LedgerStore`) and the Redis authority
(:class:`~prefect_baton._stores.redis.authority.RedisAuthority`). :class:`ReceiptedLeaseOps`
holds, once for both, the protocol signature of each of these operations
(:class:`~prefect_baton._stores.protocol.LeaseAuthority`) and the receipt's operation name;
each authority implements the unkeyed operation (``_renew``, ``_transfer``, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from prefect_baton._rules.access import check_force_release
from prefect_baton._rules.core import ReleaseRequest, RenewRequest, TransferRequest
from prefect_baton._rules.handoffs import resolution_recorded
from prefect_baton._stores.ledger.receipts import receipted, run_once
from prefect_baton._stores.protocol import Caller, Idempotency, RecordStore, ResolveRequest
from prefect_baton.errors import NotFoundError
from prefect_baton.models import Handoff, Lease, Receipt

if TYPE_CHECKING:
    from prefect_baton._stores.ledger.base import StoreBase

__all__ = ["ReceiptedLeaseOps"]


class ReceiptedLeaseOps:
    """The operations of :class:`~prefect_baton._stores.protocol.LeaseAuthority` that take
    an :class:`~prefect_baton._stores.protocol.Idempotency`, each run at most once per key
    with its receipt in :attr:`receipt_ledger` (:func:`receipted`, operation names
    ``renew``, ``transfer``, ``release``, ``release_by_id``, ``force_release``,
    ``resolve``). Arguments, results and errors are the protocol's; a subclass implements
    the same operation without the key (``_renew`` ... ``_handoff_resolve``).
    """

    @property
    def receipt_ledger(self) -> StoreBase:
        """The ledger keeping the receipts (implemented by the subclass)."""
        raise NotImplementedError

    @receipted("renew", Lease)
    def renew(
        self, caller: Caller, request: RenewRequest, *, idempotency: Idempotency | None = None
    ) -> Lease:
        """Renew by proof (:meth:`LeaseAuthority.renew
        <prefect_baton._stores.protocol.LeaseAuthority.renew>`)."""
        return self._renew(caller, request)

    @receipted("transfer", Lease)
    def transfer(
        self, caller: Caller, request: TransferRequest, *, idempotency: Idempotency | None = None
    ) -> Lease:
        """Transfer by proof (:meth:`LeaseAuthority.transfer
        <prefect_baton._stores.protocol.LeaseAuthority.transfer>`)."""
        return self._transfer(caller, request)

    @receipted("release", Receipt)
    def release(
        self, caller: Caller, request: ReleaseRequest, *, idempotency: Idempotency | None = None
    ) -> Receipt:
        """Release by proof (:meth:`LeaseAuthority.release
        <prefect_baton._stores.protocol.LeaseAuthority.release>`)."""
        return self._release(caller, request)

    @receipted("release_by_id", Receipt)
    def release_by_id(
        self, caller: Caller, lease_id: str, *, idempotency: Idempotency | None = None
    ) -> Receipt:
        """Release by id as its holder (:meth:`LeaseAuthority.release_by_id
        <prefect_baton._stores.protocol.LeaseAuthority.release_by_id>`)."""
        return self._release_by_id(caller, lease_id)

    def force_release(
        self, caller: Caller, lease_id: str, *, idempotency: Idempotency | None = None
    ) -> Receipt:
        """Release any lease of the org as ``owner``/``admin`` (:meth:`LeaseAuthority.
        force_release <prefect_baton._stores.protocol.LeaseAuthority.force_release>`); an
        ``agent`` is refused (``ForbiddenError``) before any receipt is looked at."""
        check_force_release(caller.role)
        return run_once(
            self.receipt_ledger,
            caller,
            "force_release",
            idempotency,
            Receipt,
            lambda: self._force_release(caller, lease_id),
        )

    def handoff_resolve(
        self, caller: Caller, request: ResolveRequest, *, idempotency: Idempotency | None = None
    ) -> Handoff:
        """Accept or reject a handoff (:meth:`LeaseAuthority.handoff_resolve
        <prefect_baton._stores.protocol.LeaseAuthority.handoff_resolve>`). A keyed retry
        whose earlier claim never stored its receipt (the process died, or storing it
        failed, after the resolution committed) replays the handoff when it reads as that
        request resolved it (:func:`~prefect_baton._rules.handoffs.resolution_recorded`)."""
        if idempotency is None:
            return self._handoff_resolve(caller, request)
        return run_once(
            self.receipt_ledger,
            caller,
            "resolve",
            idempotency,
            Handoff,
            lambda: self._handoff_resolve(caller, request),
            recover=lambda: self._resolve_recorded(caller, request),
        )

    def _resolve_recorded(self, caller: Caller, request: ResolveRequest) -> Handoff | None:
        """The handoff as ``request`` resolved it, if it reads so (else ``None``)."""
        self.ledger_barrier(caller)
        # the ledger keeping the receipts keeps the handoffs too (a LedgerStore)
        ledger = cast("RecordStore", self.receipt_ledger)
        try:
            h = ledger.handoff_get(caller, request.handoff_id)
        except NotFoundError:
            return None
        recorded = resolution_recorded(
            h.handoff_id,
            status=h.status,
            note=h.note,
            carried_lease=h.lease_id is not None,
            held_key=h.lease.execution_key if h.lease is not None else None,
            asked_status=request.status,
            asked_note=request.note,
            asked_key=request.execution_key,
        )
        return h if recorded else None

    # the operations without the key, implemented by each authority

    def _renew(self, caller: Caller, request: RenewRequest) -> Lease:
        raise NotImplementedError

    def _transfer(self, caller: Caller, request: TransferRequest) -> Lease:
        raise NotImplementedError

    def _release(self, caller: Caller, request: ReleaseRequest) -> Receipt:
        raise NotImplementedError

    def _release_by_id(self, caller: Caller, lease_id: str) -> Receipt:
        raise NotImplementedError

    def _force_release(self, caller: Caller, lease_id: str) -> Receipt:
        raise NotImplementedError

    def ledger_barrier(self, caller: Caller) -> None:
        """Make the ledger see the caller's lease transitions (implemented by the
        subclass)."""
        raise NotImplementedError

    def _handoff_resolve(self, caller: Caller, resolution: ResolveRequest) -> Handoff:
        raise NotImplementedError
