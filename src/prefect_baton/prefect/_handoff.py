"""Flow-level handoffs between deployments: :func:`handoff_to` and :func:`accept_handoff`.

The sender records a handoff (optionally with a checkpoint and its lease) and starts the
recipient's deployment with ``handoff_id`` among its parameters; the recipient's run accepts
it, takes over the lease under its own execution key (its flow run id), resumes from the
checkpoint, and from then on the sender's lease generation is stale: the sender's fenced
writes fail with :class:`~prefect_baton.errors.StaleFenceError` (DESIGN.md "Handoffs").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio.to_thread

from .._client import Baton
from .._keeper import LeaseKeeper
from ..errors import LeaseLostError, NotFoundError, ValidationError
from ..models import Checkpoint, Handoff, Lease
from ._context import (
    BatonLike,
    LeaseSlot,
    RunIdentity,
    current_slot,
    pop_slot,
    push_slot,
    resolve_baton,
    retry_follows,
    run_identity,
)
from ._events import emit_handoff_event, emit_lease_event

__all__ = ["AcceptedHandoff", "HandoffRejected", "SentHandoff", "accept_handoff", "handoff_to"]

log = logging.getLogger("prefect_baton.prefect")

HANDOFF_PARAMETER = "handoff_id"


class HandoffRejected(Exception):
    """Raise inside an :func:`accept_handoff` block, before accepting, to reject the handoff.

    The handoff is resolved ``rejected`` with ``reason`` as its note, the sender keeps its
    lease, and the block ends without error. Raised after acceptance it propagates (an
    accepted handoff is never turned into a rejected one) and the taken-over lease is
    released.

    Args:
        reason: why (``str``), stored as the handoff's note.
    """

    def __init__(self, reason: str = "rejected by the recipient") -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class SentHandoff:
    """What :func:`handoff_to` did.

    Attributes:
        handoff: the recorded :class:`~prefect_baton.Handoff` (``replayed`` on a retry).
        flow_run: the recipient's Prefect flow run when a deployment was started, else
            ``None``.
    """

    handoff: Handoff
    flow_run: Any = None

    @property
    def handoff_id(self) -> str:
        """The handoff's id (``str``)."""
        return self.handoff.handoff_id


def start_recipient(
    handoff_id: str, deployment: str, parameters: dict[str, Any] | None = None
) -> Any:
    """Start ``deployment`` for a handoff, once.

    Args:
        handoff_id: passed as the ``handoff_id`` parameter and used as Prefect's
            idempotency key, so a retried call returns the same flow run.
        deployment: ``"<flow name>/<deployment name>"``.
        parameters: more parameters for the run.

    Returns:
        The created ``prefect.client.schemas.objects.FlowRun`` (not awaited: ``timeout=0``).

    Raises:
        ValueError, prefect.exceptions.ObjectNotFound: unknown deployment; what Prefect's
        ``run_deployment`` raises.
    """
    from prefect.deployments import run_deployment

    params = {**(parameters or {}), HANDOFF_PARAMETER: handoff_id}
    return run_deployment(
        deployment, parameters=params, timeout=0, idempotency_key=handoff_id, as_subflow=False
    )


def _client_for(baton: BatonLike | None, ident: RunIdentity, slot: LeaseSlot | None) -> Baton:
    if baton is None and slot is not None:
        return slot.baton
    return resolve_baton(baton, ident.principal)


def handoff_to(
    principal: str | None,
    subject_id: str,
    *,
    checkpoint: dict[str, Any] | Checkpoint | str | None = None,
    message: str | None = None,
    lease: LeaseKeeper | Lease | None = None,
    deployment: str | None = None,
    parameters: dict[str, Any] | None = None,
    baton: BatonLike | None = None,
    idempotency_key: str | None = None,
    checkpoint_kind: str = "handoff",
    expires_in_seconds: int | None = None,
) -> SentHandoff:
    """Hand ``subject_id`` to ``principal`` and, with ``deployment``, start its run.

    Args:
        principal: the recipient (``str``); ``None`` with ``deployment`` given means the
            deployment's name, which is the principal its runs act as by default.
        subject_id: what is handed over (``str``).
        checkpoint: resumable state for the recipient: a JSON object (saved now as the
            checkpoint ``(subject_id, checkpoint_kind)``, fenced by ``lease``), a
            :class:`Checkpoint`, or a checkpoint id.
        message: a note for the recipient.
        lease: a lease you hold (typically ``current_lease()``); accepting the handoff
            transfers it to the recipient. The lease is then no longer released when your
            block ends (it stays held, unrenewed after the block, until the recipient
            accepts or its TTL runs out: choose a TTL longer than the recipient's start-up).
        deployment: the recipient's deployment ``"<flow>/<deployment>"``; started with
            ``handoff_id`` among its parameters and the handoff id as Prefect idempotency
            key, so a retried call starts one run only.
        parameters: more parameters for that run.
        baton: client or factory (see :func:`leased`); default: the enclosing lease's
            client, else ``Baton.from_settings()`` acting as the run's principal.
        idempotency_key: for the handoff record; default inside a run
            ``"<execution key>:handoff:<principal>:<subject_id>"`` so a Prefect retry replays
            the same handoff (and starts the same run).
        checkpoint_kind: the kind of a checkpoint saved from a dict (default ``handoff``).
        expires_in_seconds: the handoff reads ``expired`` after this long.

    Returns:
        :class:`SentHandoff` with the handoff and the started flow run.

    Raises:
        ValidationError: no recipient, a handoff to yourself, bad ids. LeaseLostError: the
        lease is not held. StaleFenceError: the checkpoint save's fence is stale.
        NotFoundError: unknown checkpoint. Prefect errors from starting the deployment
        (the handoff stays recorded and pending; ``dispatch_handoffs`` can start it later).
    """
    to = principal or deployment
    if not to:
        raise ValidationError("handoff_to needs a principal or a deployment")
    ident = run_identity()
    slot = current_slot()
    b = _client_for(baton, ident, slot)
    key = idempotency_key
    if key is None and ident.in_run:
        key = f"{ident.execution_key}:handoff:{to}:{subject_id}"
    ck_id: str | None
    if isinstance(checkpoint, dict):
        ck_id = b.checkpoints.save(
            subject_id, checkpoint_kind, checkpoint, fence=lease
        ).checkpoint_id
    elif isinstance(checkpoint, Checkpoint):
        ck_id = checkpoint.checkpoint_id
    else:
        ck_id = checkpoint
    handoff = b.handoffs.create(
        to,
        subject_id,
        checkpoint_id=ck_id,
        message=message,
        lease=lease,
        idempotency_key=key,
        expires_in_seconds=expires_in_seconds,
    )
    if isinstance(lease, LeaseKeeper):
        lease.release_on_exit = False
        if slot is not None and slot.keeper is lease:
            slot.handed_off = True
    if not handoff.replayed:
        emit_handoff_event(b, "handoff.created", handoff)
    flow_run = None
    if deployment is not None:
        flow_run = start_recipient(handoff.handoff_id, deployment, parameters)
    return SentHandoff(handoff=handoff, flow_run=flow_run)


async def ahandoff_to(principal: str | None, subject_id: str, **kwargs: Any) -> SentHandoff:
    """:func:`handoff_to` for async code (the ledger calls run on a worker thread)."""
    return await anyio.to_thread.run_sync(lambda: handoff_to(principal, subject_id, **kwargs))


class AcceptedHandoff:
    """The receiving side of a handoff; use as ``with`` or ``async with`` (see
    :func:`accept_handoff`).

    Attributes:
        handoff: the :class:`Handoff` (as read on entry; after acceptance, as accepted).
        checkpoint: the attached :class:`Checkpoint`, or ``None``.
        status: ``"pending"`` until accepted, then ``"accepted"`` or ``"rejected"``.
    """

    def __init__(
        self,
        handoff_id: str,
        *,
        defer: bool = False,
        ttl_seconds: int | None = None,
        baton: BatonLike | None = None,
        note: str | None = None,
    ) -> None:
        self.handoff_id = handoff_id
        self._defer = defer
        self._ttl = ttl_seconds
        self._baton = baton
        self._note = note
        self._b: Baton | None = None
        self._ident: RunIdentity | None = None
        self._slot: LeaseSlot | None = None
        self._token: Any = None
        self.handoff: Handoff | None = None
        self.checkpoint: Checkpoint | None = None
        self.status = "pending"

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
        b = self._b = resolve_baton(self._baton, ident.principal)
        h = self.handoff = b.handoffs.get(self.handoff_id)
        if h.to_principal != b.principal:
            raise ValidationError(
                f"handoff {h.handoff_id} is addressed to {h.to_principal!r}, not {b.principal!r}"
            )
        if h.checkpoint_id is not None:
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
        elif h.status != "pending":
            raise NotFoundError(f"pending handoff {h.handoff_id} not found ({h.status})")
        elif not self._defer:
            self._accept()

    def _hold(self, lease: Lease) -> None:
        assert self._b is not None and self._ident is not None
        keeper = self._b.lease(
            lease.resource_type,
            lease.resource_id,
            ttl_seconds=self._ttl or lease.ttl_seconds,
            idempotency_key=self._ident.execution_key,
        )
        keeper.start()  # same principal and execution key: adopts the generation (no-op)
        self._slot = LeaseSlot(keeper=keeper, baton=self._b, identity=self._ident)

    def _accept(self) -> None:
        assert self._b is not None and self._ident is not None
        h = self._b.handoffs.resolve(
            self.handoff_id,
            "accepted",
            self._note,
            execution_key=self._ident.execution_key,
            ttl_seconds=self._ttl,
        )
        self.handoff = h
        self.status = "accepted"
        emit_handoff_event(self._b, "handoff.accepted", h)
        if h.lease is not None:
            emit_lease_event(self._b, "lease.transferred", h.lease)
            self._hold(h.lease)

    def _reject(self, reason: str) -> None:
        assert self._b is not None
        h = self._b.handoffs.resolve(self.handoff_id, "rejected", reason)
        self.handoff = h
        self.status = "rejected"
        emit_handoff_event(self._b, "handoff.rejected", h)

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
        if isinstance(exc, HandoffRejected):
            log.error("HandoffRejected after %s was accepted: releasing its lease", self.handoff_id)
        assert self._ident is not None
        keep = exc is not None and retry_follows(self._ident, exc)
        keeper.release_on_exit = not keep and not slot.handed_off
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
            LeaseLostError: the sender no longer holds the attached lease (it expired
            before acceptance); the handoff stays pending. NotFoundError: already resolved.
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
        self._open()
        self._push()
        return self

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        self._pop()
        return self._close(exc)

    async def __aenter__(self) -> AcceptedHandoff:
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
) -> AcceptedHandoff:
    """Receive a handoff: ``with accept_handoff(handoff_id) as h:`` (or ``async with``).

    On entry it reads the handoff (it must be addressed to this run's principal) and its
    checkpoint (``h.checkpoint``, ``h.state``), then accepts it: the attached lease moves to
    this run under its execution key (the flow run id) in the same ledger transaction, and
    a heartbeat renews it for the block; ``h.lease`` and :func:`current_lease` return it.
    A Prefect retry of the run that accepted resumes the accepted handoff and its lease.

    With ``defer=True`` entry only reads; call ``h.accept()`` / ``await h.aaccept()`` when
    ready (a block that ends without either accepts at exit). Raising
    :class:`HandoffRejected` before acceptance rejects the handoff (the sender keeps its
    lease) and ends the block cleanly; another exception before acceptance leaves it
    pending.

    On exit the lease is released, except when a Prefect retry follows a failure (kept for
    the retry, as ``@leased``) or it was handed on with :func:`handoff_to`.

    Args:
        handoff_id: the handoff (``str``). defer: accept explicitly later (``bool``).
        ttl_seconds: TTL of the taken-over lease (10..86,400 s; default the sender's).
        baton: client or factory (see :func:`leased`). note: the acceptance note.

    Raises:
        NotFoundError: unknown, expired or already resolved (by someone else).
        ValidationError: addressed to another principal. LeaseLostError: the sender's lease
        lapsed before acceptance (the handoff stays pending), or the lease was lost during
        the block (at exit).
    """
    return AcceptedHandoff(handoff_id, defer=defer, ttl_seconds=ttl_seconds, baton=baton, note=note)
