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

from typing import TYPE_CHECKING

from prefect_baton._rules.access import check_force_release
from prefect_baton._rules.core import ReleaseRequest, RenewRequest, TransferRequest
from prefect_baton._stores.ledger.receipts import receipted, run_once
from prefect_baton._stores.protocol import Caller, Idempotency, ResolveRequest
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

    @receipted("resolve", Handoff)
    def handoff_resolve(
        self, caller: Caller, request: ResolveRequest, *, idempotency: Idempotency | None = None
    ) -> Handoff:
        """Accept or reject a handoff (:meth:`LeaseAuthority.handoff_resolve
        <prefect_baton._stores.protocol.LeaseAuthority.handoff_resolve>`)."""
        return self._handoff_resolve(caller, request)

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

    def _handoff_resolve(self, caller: Caller, resolution: ResolveRequest) -> Handoff:
        raise NotImplementedError
