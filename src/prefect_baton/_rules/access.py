"""Roles and visibility: who may do and see what in an org (DESIGN.md, "Roles").

An ``agent`` acts on and sees its own leases and handoffs; an ``owner`` or ``admin`` of
the org may also read and list anyone's, and force-release any lease. Anyone of the org
may inspect a resource, but only the holder sees its lease (holder, execution key,
purpose, scopes); others see that it is held, its counters and until when. A checkpoint is
read by its writer, the recipient of a pending or accepted handoff carrying it, and
``owner``/``admin``. An
outcome links only records its recorder may read (:func:`check_outcome_link`). No I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefect_baton._rules.validation import EVERYONE
from prefect_baton.errors import ConflictError, ForbiddenError, NotFoundError, ValidationError

if TYPE_CHECKING:
    from prefect_baton._rules.core import Generation

__all__ = [
    "CHECKPOINT_GRANTING_STATUSES",
    "PRIVILEGED_ROLES",
    "InspectView",
    "can_force_release",
    "check_checkpoint_attachable",
    "check_checkpoint_delete",
    "check_checkpoint_live",
    "check_force_release",
    "check_list_owner",
    "check_outcome_link",
    "check_resolver",
    "check_scope",
    "checkpoint_readers",
    "inspect_view",
    "may_read",
    "may_read_checkpoint",
    "sees_everything",
]

PRIVILEGED_ROLES = ("owner", "admin")
"""The roles that see and may end every principal's leases of the org."""


def sees_everything(role: str) -> bool:
    """Whether ``role`` reads and lists every principal's leases and handoffs."""
    return role in PRIVILEGED_ROLES


def can_force_release(role: str) -> bool:
    """Whether ``role`` may force-release another principal's lease."""
    return role in PRIVILEGED_ROLES


def check_force_release(role: str) -> None:
    """Raise :class:`ForbiddenError` unless ``role`` may force-release."""
    if not can_force_release(role):
        raise ForbiddenError("force release needs the owner or admin role")


def check_scope(granted: Collection[str] | None, need: str | None) -> None:
    """The one scope rule of every surface that takes bearer keys (the REST API's routes,
    its timeline picture, the MCP tools over HTTP): a key may act only within its scopes,
    and this is checked before anything of the request's input is looked at, so a key
    that may not use an operation learns that (``FORBIDDEN``) and nothing about its
    arguments.

    Args:
        granted: the key's scopes (``Collection[str]``, e.g. ``("leases:read",)``), or
            ``None`` for a caller trusted with every scope (MCP over stdio).
        need: the scope the operation needs (``str``, ``<area>:read`` or
            ``<area>:write``), or ``None`` when it needs none.

    Raises:
        ForbiddenError: ``this key lacks the scope <need>``.
    """
    if granted is not None and need is not None and need not in granted:
        raise ForbiddenError(f"this key lacks the scope {need}")


def may_read(role: str, principal: str, parties: Iterable[str]) -> bool:
    """Whether ``principal`` with ``role`` may read a record whose parties (a lease's
    owner; a handoff's sender and recipient) are ``parties``: a party may, and so may a
    role that :func:`sees_everything`."""
    return principal in parties or sees_everything(role)


CHECKPOINT_GRANTING_STATUSES = ("pending", "accepted")
"""The statuses (as a handoff reads, :func:`~prefect_baton._rules.handoffs.handoff_status`)
in which a handoff lets its recipient read the checkpoint it carries: a rejected or expired
one (a pending one past its expiry, or whose carried lease ended, reads ``expired``) no
longer does, so a recipient who declined or never acted does not go on reading the
writer's later versions of it."""


def checkpoint_readers(writer: str, carriers: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """Who may read a checkpoint besides ``owner``/``admin`` (DESIGN.md "Checkpoints"): its
    ``writer``, and the recipient of every handoff carrying it that reads as one of
    :data:`CHECKPOINT_GRANTING_STATUSES`.

    Args:
        writer: the checkpoint's writer (``str`` principal).
        carriers: ``(to_principal, status)`` of every handoff of the org whose
            ``checkpoint_id`` is this checkpoint's, ``status`` as the handoff reads
            (:func:`~prefect_baton._rules.handoffs.handoff_status`, not as stored).

    Returns:
        The readers (``tuple[str, ...]``), the writer first.
    """
    granted = (to for to, status in carriers if status in CHECKPOINT_GRANTING_STATUSES)
    return (writer, *granted)


def may_read_checkpoint(
    role: str, principal: str, writer: str, carriers: Iterable[tuple[str, str]]
) -> bool:
    """Whether ``principal`` with ``role`` may read a checkpoint written by ``writer``
    (DESIGN.md "Checkpoints"): its writer may, so may the recipient of a handoff carrying it
    while that handoff reads pending or accepted (``carriers``: ``(to_principal, status)``
    of the org's handoffs carrying it, see :func:`checkpoint_readers`), and so may
    ``owner``/``admin``. To everyone else the checkpoint does not exist (stores answer not
    found)."""
    return may_read(role, principal, checkpoint_readers(writer, carriers))


def check_outcome_link(
    role: str, principal: str, kind: str, link_id: str, parties: Iterable[str] | None
) -> None:
    """Check that ``principal`` with ``role`` may link the ``kind`` record ``link_id`` from
    an outcome it records: one links what one may read (:func:`may_read`, the rule of
    ``leases.get``, ``handoffs.get`` and, with the parties below, ``checkpoints.get_by_id``'s
    :func:`may_read_checkpoint`), and to everyone else the record does not exist, so the
    refusal is the unknown id's ``NOT_FOUND`` and says nothing about whether it exists
    (DESIGN.md "Checkpoints": "to everyone else it does not exist (not found), as in the
    seed service"; "Outcomes": the links are to "the lease, handoff and checkpoint it
    concerns"; seed 000: another organization's lease is ``404``).

    So an ``agent`` links only the lease generations it holds or held (a generation has
    one owner for all time: a transfer makes a new one), the handoffs it sent or received
    and the checkpoints it wrote or was handed (by a handoff still pending or accepted);
    ``owner``/``admin`` link any of the org's, as they read them and may force-release any
    lease. A lease link names the generation
    the outcome is recorded under (:func:`~prefect_baton._rules.outcomes.check_outcome`), so
    only its holder, or an owner/admin settling it in the holder's place (the outcome is
    credited to them), can take up that generation's one ``succeeded`` outcome.

    Args:
        role: the caller's role. principal: the caller.
        kind: ``"lease"``, ``"handoff"`` or ``"checkpoint"``. link_id: the id linked.
        parties: who may read the record besides ``owner``/``admin`` (a lease generation:
            its owner; a handoff: its sender and recipient; a checkpoint: its
            :func:`checkpoint_readers`), or ``None`` when the caller's org has no such
            record.

    Raises:
        NotFoundError: ``<kind> <link_id> not found``, for an unknown id, another org's
            record and one the caller may not read alike.
    """
    if parties is None or not may_read(role, principal, parties):
        raise NotFoundError(f"{kind} {link_id} not found")


def check_list_owner(role: str, principal: str, owner: str, what: str = "leases") -> None:
    """Check a listing of ``owner``'s records (a name, or ``"*"`` for everyone's) by
    ``principal`` with ``role``: the leases ``owner`` holds, or (``what="handoffs"``) the
    handoffs ``owner`` sent or received. One's own needs no role; anyone else's, and
    everyone's, needs ``owner``/``admin`` (:func:`sees_everything`).

    ``"*"`` always means everyone's, also for a principal that happens to be named ``*``
    (principals are registered on first use, so the name cannot be ruled out): an agent
    named ``*`` asking for ``"*"`` is refused like any other agent.

    Raises:
        ForbiddenError: another principal's (or everyone's) records, without the owner or
            admin role.
    """
    if (owner == EVERYONE or owner != principal) and not sees_everything(role):
        raise ForbiddenError(f"listing another principal's {what} needs the owner or admin role")


#: The seed service's refusal of a resolve by anyone but the handoff's target.
NOT_TARGET_MESSAGE = "Only the target principal can resolve a handoff."


def check_resolver(to_principal: str, principal: str) -> None:
    """Check that ``principal`` may resolve a pending handoff addressed to ``to_principal``.

    Raises:
        ValidationError: ``principal`` is not the target, with the seed service's message
            :data:`NOT_TARGET_MESSAGE` (DESIGN.md, "Handoffs"; the seed answers
            ``VALIDATION_ERROR``, not ``FORBIDDEN``, whatever the caller's role).
    """
    if principal != to_principal:
        raise ValidationError(NOT_TARGET_MESSAGE)


def check_checkpoint_delete(
    checkpoint_id: str, writer: str, principal: str, carried_by: str | None
) -> None:
    """Check that ``principal`` may delete checkpoint ``checkpoint_id`` written by
    ``writer`` (the seed service's ``DELETE`` of one's own checkpoint).

    Args:
        carried_by: the id of a pending, unexpired handoff that carries the checkpoint, or
            ``None``: the recipient was promised it, so it may not disappear under them.

    Raises:
        ForbiddenError: ``principal`` is not its writer (whatever the role: only the
            writer changes a checkpoint).
        ConflictError: a pending handoff carries it (retry once that handoff is resolved
            or has expired).
    """
    if principal != writer:
        raise ForbiddenError(f"only its writer can delete checkpoint {checkpoint_id}")
    if carried_by is not None:
        raise ConflictError(
            f"checkpoint {checkpoint_id} is carried by pending handoff {carried_by}; it can "
            "be deleted once that handoff is resolved or has expired"
        )


def check_checkpoint_attachable(
    checkpoint_id: str,
    *,
    readable: bool,
    expires_at_ms: int | None,
    updated_at_ms: int,
    now_ms: int,
) -> None:
    """Check that a new handoff may carry checkpoint ``checkpoint_id``: the sender may read
    it (:func:`may_read_checkpoint`: attaching it makes the recipient a reader) and it still
    exists (:func:`check_checkpoint_live`). Decided under the lock that
    :func:`check_checkpoint_delete` is decided under, so a checkpoint is never deleted while
    a new pending handoff carries it.

    Args:
        readable: whether the checkpoint is of the sender's org and the sender may read it
            (``False`` also when there is no such checkpoint).
        expires_at_ms, updated_at_ms, now_ms: as for :func:`check_checkpoint_live`
            (``updated_at_ms`` is not read when ``readable`` is false).

    Raises:
        NotFoundError: unknown, not readable by the sender, deleted or past its TTL.
    """
    if not readable:
        raise NotFoundError(f"checkpoint {checkpoint_id} not found")
    check_checkpoint_live(
        checkpoint_id, expires_at_ms=expires_at_ms, updated_at_ms=updated_at_ms, now_ms=now_ms
    )


def check_checkpoint_live(
    checkpoint_id: str, *, expires_at_ms: int | None, updated_at_ms: int, now_ms: int
) -> None:
    """Check that checkpoint ``checkpoint_id`` was neither deleted nor is past its TTL, and
    say which when it is gone. A delete sets its expiry to the delete's time, which is also
    the time it was last updated; a save's TTL is at least a second, so a saved checkpoint
    expires after its last update: the two are told apart exactly.

    Args:
        expires_at_ms: when it expires or was deleted (epoch ms; ``None``: never).
        updated_at_ms: when it was last saved or deleted (epoch ms).
        now_ms: the store's clock (epoch ms).

    Raises:
        NotFoundError: deleted (``... was deleted``) or past its TTL (``... has expired``).
    """
    if expires_at_ms is None or expires_at_ms > now_ms:
        return
    if expires_at_ms == updated_at_ms:
        raise NotFoundError(f"checkpoint {checkpoint_id} was deleted")
    raise NotFoundError(f"checkpoint {checkpoint_id} has expired")


@dataclass(frozen=True, slots=True)
class InspectView:
    """What a caller sees of a resource: whether it is held, its version and epoch (0 when
    never leased), the expiry (epoch ms, only while held) and the lease itself (only for
    its holder)."""

    held: bool
    version: int
    epoch: int
    expires_at_ms: int | None
    lease: Generation | None


def inspect_view(head: Generation | None, *, principal: str, now_ms: int) -> InspectView:
    """The inspect redaction: what ``principal`` may see of a resource whose newest
    generation is ``head`` (``None`` if never leased), judged at ``now_ms``."""
    if head is None:
        return InspectView(held=False, version=0, epoch=0, expires_at_ms=None, lease=None)
    held = head.effective(now_ms)
    return InspectView(
        held=held,
        version=head.version,
        epoch=head.epoch,
        expires_at_ms=head.expires_at_ms if held else None,
        lease=head if held and head.owner == principal else None,
    )
