"""The queries of the stores' list operations: which leases
:meth:`~prefect_baton._stores.protocol.LeaseAuthority.list_leases` lists
(:class:`LeaseQuery`) and which handoffs
:meth:`~prefect_baton._stores.protocol.RecordStore.handoff_list` lists
(:class:`HandoffQuery`), which events
:meth:`~prefect_baton._stores.protocol.RecordStore.events_list` lists (:class:`EventQuery`)
and which outcomes :meth:`~prefect_baton._stores.protocol.RecordStore.outcome_list` lists
(:class:`OutcomeQuery`), as the client validated them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EventQuery", "HandoffQuery", "HistoryQuery", "LeaseQuery", "OutcomeQuery"]


@dataclass(frozen=True, slots=True)
class LeaseQuery:
    """Which leases :meth:`~prefect_baton._stores.protocol.LeaseAuthority.list_leases`
    lists (validated by the client).

    Attributes:
        resource_type: only leases of this type (``str``), or ``None`` (any).
        owner: whose leases: ``None`` (the caller's), a principal (``str`` id) or ``"*"``
            (everyone's); another principal's needs ``owner``/``admin``.
        include_ended: also ended and expired generations (``bool``).
        limit: at most this many leases (``int``, 1 to 10,001: one more than the largest
            page, :func:`~prefect_baton._rules.paging.store_limit`).
        after: the page continues after this ``(acquired_at ms, lease_id)`` (the last
            lease of the previous page), or ``None`` (the first page).
    """

    resource_type: str | None = None
    owner: str | None = None
    include_ended: bool = False
    limit: int = 100
    after: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class HandoffQuery:
    """Which handoffs :meth:`~prefect_baton._stores.protocol.RecordStore.handoff_list`
    lists (validated by the client).

    Attributes:
        party: whose handoffs: ``None`` (the caller's: those it sent or received), a
            principal (``str`` id: those it sent or received) or ``"*"`` (everyone's in the
            org); another principal's or everyone's needs ``owner``/``admin``
            (:func:`prefect_baton._rules.access.check_list_owner`).
        status: only handoffs that read as this status (``pending``, ``accepted``,
            ``rejected`` or ``expired``; a pending one past its expiry reads ``expired``),
            or ``None`` (any).
        limit: at most this many handoffs (``int``, 1 to 10,001, as ``LeaseQuery.limit``).
        after: the page continues after this ``(created_at ms, handoff_id)`` (the last
            handoff of the previous page), or ``None`` (the first page).
    """

    party: str | None = None
    status: str | None = "pending"
    limit: int = 100
    after: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class EventQuery:
    """Which events :meth:`~prefect_baton._stores.protocol.RecordStore.events_list` lists,
    in ``seq`` order (validated by the client).

    Attributes:
        after_seq: only events with ``seq`` above this (``int``, 0: from the start).
        limit: at most this many events (``int``, 1 to 1,001, as ``LeaseQuery.limit``).
        kind: only events of this kind (one of
            :data:`~prefect_baton._rules.events.EVENT_KINDS`), or ``None`` (any).
        resource: only the events of the leases of this ``(resource_type, resource_id)``
            (the events whose payload's ``lease_id`` names one of its generations: its
            ``lease.*`` and ``fence.rejected`` events, and the ``handoff.*`` events of
            handoffs carrying one), or ``None`` (any).
        subject: only events whose ``subject`` is exactly this (``str``), or ``None``.
    """

    after_seq: int = 0
    limit: int = 100
    kind: str | None = None
    resource: tuple[str, str] | None = None
    subject: str | None = None


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """Which versions :meth:`~prefect_baton._stores.protocol.RecordStore.checkpoint_history`
    lists: those of the checkpoint of ``(subject_id, principal, kind)``, oldest first (by
    version; validated by the client).

    Attributes:
        subject_id: the checkpoint's subject (``str`` id).
        kind: the checkpoint's kind (``str`` id).
        principal: whose checkpoint (``str`` id), or ``None`` (the caller's).
        limit: at most this many versions (``int``, 1 to 1,001: one more than the largest
            page, :func:`~prefect_baton._rules.paging.store_limit`).
        after: the page continues after this ``(version, checkpoint_id)`` (the last
            version of the previous page), or ``None`` (the first page).
    """

    subject_id: str
    kind: str
    principal: str | None = None
    limit: int = 100
    after: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class OutcomeQuery:
    """Which outcomes :meth:`~prefect_baton._stores.protocol.RecordStore.outcome_list`
    lists, oldest first (by record time in ms, then outcome id; validated by the client).

    Attributes:
        subject_id: only the outcomes of this subject (``str`` id), or ``None`` (any).
        limit: at most this many outcomes (``int``, 1 to 100,001: one more than the largest
            page, :func:`~prefect_baton._rules.paging.store_limit`).
        after: the page continues after this ``(recorded_at ms, outcome_id)`` (the last
            outcome of the previous page), or ``None`` (the first page).
    """

    subject_id: str | None = None
    limit: int = 1000
    after: tuple[int, str] | None = None
