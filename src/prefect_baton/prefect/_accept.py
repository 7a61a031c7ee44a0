"""The receiving side of a handoff: :func:`accept_handoff` (``with`` / ``async with``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import anyio.to_thread

from prefect_baton._client.keeper import EnterOnce, LeaseKeeper
from prefect_baton._client.sync import Baton
from prefect_baton._rules.events import RELEASE_HANDOFF_EXPIRED, RELEASE_HANDOFF_REJECTED
from prefect_baton.errors import ConflictError, LeaseLostError, NotFoundError, ValidationError
from prefect_baton.models import Checkpoint, Handoff, Lease
from prefect_baton.prefect._context import (
    BatonLike,
    LeaseSlot,
    RunIdentity,
    pop_slot,
    push_slot,
    resolve_baton,
    retry_follows,
    run_identity,
)
from prefect_baton.prefect._events import (
    emit_carried_release,
    emit_handoff_event,
    emit_lease_event,
)
from prefect_baton.prefect._handoff import HandoffRejected
from prefect_baton.prefect._logs import expected, run_logger
from prefect_baton.prefect._plan import refused

__all__ = ["AcceptedHandoff", "accept_handoff"]


@dataclass(eq=False, repr=False)
class AcceptedHandoff:
    """The receiving side of a handoff; use as ``with`` or ``async with`` (see
    :func:`accept_handoff`, which takes the same arguments).

    Attributes:
        handoff: the :class:`Handoff` (as read on entry; after acceptance, as accepted).
        checkpoint: the attached :class:`Checkpoint`, or ``None``.
        status: ``"pending"`` until accepted, then ``"accepted"`` or ``"rejected"``.
    """

    handoff_id: str
    _: KW_ONLY
    defer: bool = False
    ttl_seconds: int | None = None
    baton: BatonLike | None = None
    note: str | None = None
    principal: str | None = None
    handoff: Handoff | None = field(default=None, init=False)
    checkpoint: Checkpoint | None = field(default=None, init=False)
    status: str = field(default="pending", init=False)
    _b: Baton | None = field(default=None, init=False)
    _ident: RunIdentity | None = field(default=None, init=False)
    _slot: LeaseSlot | None = field(default=None, init=False)
    _token: Any = field(default=None, init=False)
    _once: EnterOnce = field(
        default_factory=lambda: EnterOnce("accept_handoff"), init=False, repr=False
    )

    @property
    def state(self) -> dict[str, Any] | None:
        """The attached checkpoint's state (a JSON object), or ``None``."""
        return dict(self.checkpoint.state) if self.checkpoint is not None else None

    @property
    def lease(self) -> LeaseKeeper | None:
        """The taken-over lease (renewed in the background), once accepted; else ``None``."""
        return self._slot.keeper if self._slot is not None else None

    # ------------------------------------------------------------------ sync I/O

    def _open(self) -> None:
        ident = self._ident = run_identity()
        b = self._b = resolve_baton(self.baton, ident.principal, self.principal)
        try:
            h = self.handoff = b.handoffs.get(self.handoff_id)
        except NotFoundError:
            # invisible to this principal (or unknown): name who asked, never the handoff's
            # parties (another principal's handoff stays NOT_FOUND, details unseen)
            raise NotFoundError(
                f"handoff {self.handoff_id} not found for principal {b.principal!r} (a handoff "
                "is visible to its sender and recipient only; the run acts as principal= of "
                "accept_handoff, else BATON_PREFECT_PRINCIPAL, else the deployment's full "
                "name)"
            ) from None
        # a first read past its expiry ended it and released its lease: say so once
        emit_carried_release(b, h, RELEASE_HANDOFF_EXPIRED)
        if h.to_principal != b.principal:
            raise ValidationError(
                f"handoff {h.handoff_id} is addressed to {h.to_principal!r}, not {b.principal!r}"
            )
        if h.status not in ("pending", "accepted"):
            raise NotFoundError(f"pending handoff {h.handoff_id} not found ({h.status})")
        if h.checkpoint_id is not None:  # readable while the handoff is pending or accepted
            self.checkpoint = b.checkpoints.get_by_id(h.checkpoint_id)
        if h.status == "accepted":  # a retry of the run that accepted it: resume
            lease = h.lease
            if h.lease_id is not None and (
                lease is None or lease.execution_key != ident.execution_key
            ):
                raise LeaseLostError(
                    f"handoff {h.handoff_id} was accepted by another execution; its lease is "
                    "not held by this run"
                )
            self.status = "accepted"
            if lease is not None:
                self._hold(lease)
        elif not self.defer:
            self._accept()

    def _hold(self, lease: Lease) -> None:
        assert self._b is not None and self._ident is not None
        keeper = self._b.lease(
            lease.resource_type,
            lease.resource_id,
            ttl_seconds=self.ttl_seconds or lease.ttl_seconds,
            idempotency_key=self._ident.execution_key,
        )
        with self._naming_conflicts(lease):
            keeper.start()  # same principal and execution key: adopts the generation (no-op)
        self._slot = LeaseSlot(keeper=keeper, baton=self._b, identity=self._ident)

    @contextmanager
    def _naming_conflicts(self, lease: Lease | None) -> Iterator[None]:
        """Raise a conflict over ``lease``'s resource as ``@leased`` does: one line naming
        the resource and the holder's expiry, marked expected (Prefect logs no traceback
        for it, and a deployment run no "Engine execution exited" record); the run still
        fails with the :class:`ConflictError`."""
        try:
            yield
        except ConflictError as exc:
            if lease is None:
                raise
            why = f"accepting handoff {self.handoff_id}"
            raise expected(refused(lease.resource_type, lease.resource_id, exc, why)) from None

    def _accept(self) -> None:
        assert self._b is not None and self._ident is not None
        deadline = self.handoff.expires_at if self.handoff is not None else None
        if deadline is not None and datetime.now(UTC) >= deadline:
            # past its deadline (a deferred accept): read it first, so that the read that
            # ends it and releases its lease is the one seen here (and emitted once)
            late = self._b.handoffs.get(self.handoff_id)
            emit_carried_release(self._b, late, RELEASE_HANDOFF_EXPIRED)
            if late.status != "pending":
                raise NotFoundError(f"pending handoff {late.handoff_id} not found ({late.status})")
        with self._naming_conflicts(self.handoff.lease if self.handoff is not None else None):
            h = self._b.handoffs.resolve(
                self.handoff_id,
                "accepted",
                self.note,
                execution_key=self._ident.execution_key,
                ttl_seconds=self.ttl_seconds,
            )
        self.handoff = h
        self.status = "accepted"
        emit_handoff_event(self._b, "handoff.accepted", h)
        run_logger().info(
            "handoff %s of %s from %s accepted by %s%s",
            h.handoff_id,
            h.subject_id,
            h.from_principal,
            self._b.principal,
            " (lease taken over)" if h.lease is not None else "",
        )
        if h.lease is not None:
            emit_lease_event(self._b, "lease.transferred", h.lease)
            self._hold(h.lease)

    def _reject(self, reason: str) -> None:
        assert self._b is not None
        h = self._b.handoffs.resolve(self.handoff_id, "rejected", reason)
        self.handoff = h
        self.status = "rejected"
        emit_carried_release(self._b, h, RELEASE_HANDOFF_REJECTED)  # before, as in the ledger
        emit_handoff_event(self._b, "handoff.rejected", h)
        run_logger().info("handoff %s rejected: %s", h.handoff_id, reason)

    def _close(self, exc: BaseException | None) -> bool:
        """Finish; returns ``True`` to swallow ``exc`` (a rejection before acceptance)."""
        if self.status == "pending":
            if isinstance(exc, HandoffRejected):
                self._reject(exc.reason)
                return True
            if exc is not None:
                return False  # stays pending for another attempt
            self._accept()  # deferred and never accepted explicitly: the work is done
        slot = self._slot
        if slot is None:
            return False
        keeper = slot.keeper
        assert self._ident is not None
        keep = exc is not None and retry_follows(self._ident, exc)
        if isinstance(exc, HandoffRejected):
            run_logger().error(
                "HandoffRejected after %s was accepted: %s; the handoff stays accepted (to be "
                "able to reject it, open it with accept_handoff(handoff_id, defer=True) and "
                "raise HandoffRejected before h.accept())",
                self.handoff_id,
                "keeping its lease for the retry" if keep else "releasing its lease",
            )
        keeper.release_on_exit = not keep  # a handed-off lease is left to its handoff
        keeper.stop(exc)
        if keeper.receipt_status in ("released", "expired"):
            emit_lease_event(
                slot.baton, "lease.released", keeper.lease, status=keeper.receipt_status
            )
        return False

    # ------------------------------------------------------------------ public

    def accept(self) -> LeaseKeeper | None:
        """Accept now (with ``defer=True``); returns the taken-over lease or ``None``.

        Raises:
            NotFoundError: already resolved, or expired (also when the sender's lease
            ended before acceptance). LeaseLostError: the sender's lease ended in the
            instant of acceptance.
        """
        if self.status == "pending":
            self._accept()
            self._push()
        return self.lease

    async def aaccept(self) -> LeaseKeeper | None:
        """:meth:`accept` for async code."""
        if self.status == "pending":
            await anyio.to_thread.run_sync(self._accept)
            self._push()
        return self.lease

    def _push(self) -> None:
        if self._slot is not None and self._token is None:
            self._token = push_slot(self._slot)

    def _pop(self) -> None:
        if self._token is not None:
            pop_slot(self._token)
            self._token = None

    def __enter__(self) -> AcceptedHandoff:
        self._once.enter()
        self._open()
        self._push()
        return self

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        self._pop()
        return self._close(exc)

    async def __aenter__(self) -> AcceptedHandoff:
        self._once.enter()
        await anyio.to_thread.run_sync(self._open)
        self._push()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        self._pop()
        return await anyio.to_thread.run_sync(self._close, exc)


def accept_handoff(
    handoff_id: str,
    *,
    defer: bool = False,
    ttl_seconds: int | None = None,
    baton: BatonLike | None = None,
    note: str | None = None,
    principal: str | None = None,
) -> AcceptedHandoff:
    """Receive a handoff: ``with accept_handoff(handoff_id) as h:`` (or ``async with``).

    On entry it reads the handoff (it must be addressed to this run's principal) and its
    checkpoint (``h.checkpoint``, ``h.state``), then accepts it: the attached lease moves to
    this run under its execution key (the flow run id) in the same ledger transaction, and
    a heartbeat renews it for the block; ``h.lease`` and :func:`current_lease` return it.
    A Prefect retry of the run that accepted resumes the accepted handoff and its lease.

    With ``defer=True`` entry only reads; call ``h.accept()`` / ``await h.aaccept()`` when
    ready (a block that ends without either accepts at exit). Raising
    :class:`HandoffRejected` before acceptance rejects the handoff (the lease it carries is
    released, so the resource is free at once) and ends the block cleanly; another exception
    before acceptance leaves it pending.

    On exit the lease is released, except when a Prefect retry follows a failure (kept for
    the retry, as ``@leased``) or it was handed on with :func:`handoff_to`.

    Args:
        handoff_id: the handoff (``str``). defer: accept explicitly later (``bool``).
        ttl_seconds: TTL of the taken-over lease (10..86,400 s; default the sender's).
        baton: client, factory or ``"baton/<block name>"`` (see :func:`leased`).
        note: the acceptance note.
        principal: the principal to accept as (``str``; default the run's principal, see
            :func:`leased`); the handoff must be addressed to it.

    Raises:
        NotFoundError: unknown, expired (its own expiry passed, or the sender's lease ended
            before acceptance) or already resolved (by someone else); also a handoff
            neither sent nor received by the principal the run acts as (the message names
            that principal). ValidationError: addressed to another principal (the run's
            principal sent it). LeaseLostError: the lease was lost during the block (at
            exit), or the sender's ended in the instant of acceptance. ConflictError:
            another principal holds the resource (a retry of the accepting run after its
            lease lapsed); one line naming the resource and the holder's expiry, logged
            without a traceback, and the run fails with it.
    """
    return AcceptedHandoff(
        handoff_id,
        defer=defer,
        ttl_seconds=ttl_seconds,
        baton=baton,
        note=note,
        principal=principal,
    )
