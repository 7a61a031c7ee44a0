"""Value objects returned by prefect-baton (immutable pydantic models).

Times are timezone-aware UTC ``datetime`` values taken from the authority's clock (the
database's ``now()`` or Redis ``TIME``), never from the caller's. Their JSON form (REST, MCP,
CLI ``--format json``, stored receipts) is the seed service's ``2026-07-30T10:58:13.829Z``
(:func:`wire_time`); parsing accepts any ISO 8601 form (``+00:00``, microseconds) as well.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    WithJsonSchema,
    computed_field,
    model_validator,
)

__all__ = [
    "Checkpoint",
    "Event",
    "Evidence",
    "Handoff",
    "Lease",
    "LeaseInfo",
    "Outcome",
    "Page",
    "Receipt",
    "from_ms",
    "to_ms",
    "wire_time",
]

LeaseStatus = Literal[
    "active", "released", "expired", "taken_over", "transferred", "superseded", "revoked"
]
HandoffStatus = Literal["pending", "accepted", "rejected", "expired"]
EndStatus = Literal["released", "expired"]
"""How a release ended a lease: while effective, or after its TTL had run out."""
ReceiptStatus = Literal[EndStatus, "no_change"]
"""The status of a release receipt (:attr:`Receipt.status`)."""
OutcomeStatus = Literal["succeeded", "failed", "cancelled"]


def from_ms(ms: int | None) -> datetime | None:
    """Convert epoch milliseconds (``int``) to an aware UTC ``datetime`` (``None`` stays)."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC)


def to_ms(dt: datetime) -> int:
    """Convert an aware ``datetime`` to epoch milliseconds (``int``)."""
    return round(dt.timestamp() * 1000)


_PID = os.getpid()
"""This process's id, kept current in a ``fork()``-ed child."""


def _forked() -> None:
    global _PID
    _PID = os.getpid()


os.register_at_fork(after_in_child=_forked)


def private_state(cls: type[BaseModel]) -> dict[str, Any] | None:
    """The private attributes of a model of ``cls`` made in this process, for code that
    builds models without ``__init__`` (``None`` for a model without any)."""
    return {"_pid": _PID} if cls is Lease else None


def wire_time(dt: datetime) -> str:
    """The wire form of a time: UTC, milliseconds, ``Z`` (``2026-07-30T10:58:13.829Z``), as
    the seed service writes every timestamp. The one formatting function of times for REST,
    MCP and error fields (a lease ``CONFLICT``'s message and ``expires_at``).

    Args:
        dt: an aware ``datetime`` (a naive one is taken as UTC). Times here are whole
            milliseconds (the authority's clock is read in ms), so nothing is lost.
    """
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: A time field: an aware ``datetime`` in Python, :func:`wire_time` in JSON.
Time = Annotated[
    datetime,
    PlainSerializer(wire_time, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}, mode="serialization"),
]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Lease(_Model):
    """One generation of expiring ownership of a resource.

    A new generation (new ``lease_id``) starts at every acquire, takeover and transfer;
    renewals keep the ``lease_id`` and bump ``version`` only.

    Attributes:
        lease_id: ``lease_<hex>``, identifies this generation.
        resource_type, resource_id: the resource claimed.
        owner: the holding principal.
        execution_key: the idempotency key of the execution holding it, or ``None``.
        version: +1 on every transition of this resource (CAS handle).
        epoch: +1 whenever ownership changes hands: the fencing token. Strictly increasing
            per resource for all time.
        scopes: write-scope glob patterns claimed (``tuple[str, ...]``).
        status: ``active`` or how the generation ended (``released``, ``expired``,
            ``taken_over``, ``transferred``, ``superseded``, ``revoked``).
        acquired_at, expires_at: aware UTC datetimes from the authority's clock.
        ttl_seconds: the TTL of the last grant or renewal (``int``, seconds).
        released_at: when the generation ended, if it has.
        replayed: ``True`` when this came back from a stored idempotency receipt.

    A ``Lease`` remembers the process it was made in: one inherited across ``fork()`` cannot
    renew, transfer or release in the child (``VALIDATION_ERROR``). A copy made from its data
    (unpickled, ``model_validate``) belongs to the process that made it.
    """

    lease_id: str
    resource_type: str
    resource_id: str
    owner: str
    execution_key: str | None
    version: int
    epoch: int
    scopes: tuple[str, ...] = ()
    status: LeaseStatus = "active"
    purpose: str | None = None
    acquired_at: Time
    expires_at: Time
    ttl_seconds: int
    released_at: Time | None = None
    replayed: bool = False
    _pid: int = PrivateAttr(default_factory=lambda: _PID)

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        object.__setattr__(self, "__pydantic_private__", {"_pid": _PID})

    @property
    def made_in_this_process(self) -> bool:
        """``False`` for a lease inherited across ``fork()`` (made in the parent)."""
        return self._pid == _PID

    @property
    def fencing_token(self) -> int:
        """The epoch, as a fencing token (``int``) to pass to external systems."""
        return self.epoch


class LeaseInfo(_Model):
    """What :meth:`inspect` shows about a resource.

    Any principal of the org sees ``held``, ``expires_at``, ``version`` and ``epoch``; only the
    holder also gets ``lease`` (the full :class:`Lease`). Another principal never learns the
    holder, purpose or scopes.
    """

    resource_type: str
    resource_id: str
    held: bool
    version: int
    epoch: int
    expires_at: Time | None = None
    lease: Lease | None = None


class Receipt(_Model):
    """Result of a lease release.

    Attributes:
        action: ``release``, ``release_by_id`` or ``force_release``.
        status: ``released`` (released while effective), ``expired`` (the holder cleaned up
            a lease that had already run out: its protection lapsed) or ``no_change``
            (already released by the same proof).
        lease: the lease as it stands after the operation.
        forced: ``True`` when ``action`` is ``force_release`` (derived).
    """

    action: str
    status: ReceiptStatus
    lease: Lease
    replayed: bool = False

    @model_validator(mode="before")
    @classmethod
    def _derived_in(cls, data: Any) -> Any:
        # ``forced`` is derived from ``action``: its JSON form (REST, a stored receipt)
        # reads back without it.
        if isinstance(data, dict) and "forced" in data:
            data = {k: v for k, v in data.items() if k != "forced"}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def forced(self) -> bool:
        """``True`` for a force release by an ``owner``/``admin`` (the seed service's
        ``forced: true``)."""
        return self.action == "force_release"


class Evidence(_Model):
    """One evidence item of an outcome: ``kind`` (e.g. ``file``), ``uri`` (a URI or
    reference), optional ``digest`` (e.g. ``sha256:<hex>``) and ``note``."""

    kind: str = Field(min_length=1, max_length=256)
    uri: str = Field(min_length=1, max_length=4096)
    digest: str | None = Field(default=None, max_length=512)
    note: str | None = Field(default=None, max_length=4096)


class Checkpoint(_Model):
    """Resumable progress, one per ``(org, subject_id, principal, kind)``.

    ``state`` is a JSON object; ``state_hash`` is ``sha256:`` + SHA-256 of its canonical JSON;
    ``version`` is +1 per write.
    """

    checkpoint_id: str
    subject_id: str
    kind: str
    principal: str
    version: int
    state: dict[str, Any]
    state_hash: str
    created_at: Time
    updated_at: Time
    expires_at: Time | None = None
    replayed: bool = False


class Handoff(_Model):
    """An explicit transfer of a subject to ``to_principal``.

    ``lease`` is set on an accepted handoff that carried a lease, in every read of it (the
    resolve, ``get`` and ``list``): the generation the acceptance gave the recipient, as it
    stands now (renewed, or ended since: see its ``status``), for whoever may read that lease
    (the recipient, ``owner`` and ``admin``, as ``leases.get``); ``None`` for the sender, who
    no longer holds it (``_rules.handoffs.accepted_lease_view``). ``parameters``:
    parameters for the recipient's run given by the sender (a JSON object), or ``None``.
    ``released_lease`` is set on the result of the call that
    ended a lease-carrying handoff unaccepted (a rejection, or the first read of it past its
    expiry) and released the carried lease that way: the released generation (recorded as
    ``lease.released`` with ``reason`` ``handoff_rejected`` or ``handoff_expired``).
    """

    handoff_id: str
    from_principal: str
    to_principal: str
    subject_id: str
    checkpoint_id: str | None = None
    context_id: str | None = None
    message: str | None = None
    lease_id: str | None = None
    status: HandoffStatus
    created_at: Time
    expires_at: Time | None = None
    resolved_at: Time | None = None
    note: str | None = None
    lease: Lease | None = None
    released_lease: Lease | None = None
    parameters: dict[str, Any] | None = None
    replayed: bool = False


class Outcome(_Model):
    """Completion or failure of a subject, linked to its evidence."""

    outcome_id: str
    subject_id: str
    principal: str
    status: OutcomeStatus
    evidence: tuple[Evidence, ...]
    lease_id: str | None = None
    handoff_id: str | None = None
    checkpoint_id: str | None = None
    fence_epoch: int | None = None
    recorded_at: Time
    replayed: bool = False


class Event(_Model):
    """One committed transition from the ledger's event stream (outbox).

    ``seq`` increases monotonically in commit order; ``event_id`` is for de-duplication by
    relays that deliver at least once.
    """

    seq: int
    event_id: str
    kind: str
    principal: str
    subject: str
    payload: dict[str, Any]
    occurred_at: Time


_Item = TypeVar("_Item")


class Page(list[_Item]):
    """One page of a paged list (``leases.list``, ``handoffs.inbox``, ``handoffs.list``,
    ``events.list``, ``outcomes.list``, ``prefect_baton.rest.list_keys``): a ``list``
    of its items, in the list's order, and :attr:`next_cursor`.

    Attributes:
        next_cursor: the ``cursor`` argument that fetches the next page (``str``, opaque),
            or ``None`` when no item follows this page (a page exactly ``limit`` long at
            the end of the list has none).
    """

    next_cursor: str | None

    def __init__(self, items: Iterable[_Item] = (), next_cursor: str | None = None) -> None:
        super().__init__(items)
        self.next_cursor = next_cursor
