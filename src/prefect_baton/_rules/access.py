"""Roles and visibility: who may do and see what in an org (DESIGN.md, "Roles").

An ``agent`` acts on and sees its own leases and handoffs; an ``owner`` or ``admin`` of
the org may also read and list anyone's, and force-release any lease. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from prefect_baton.errors import ForbiddenError

__all__ = [
    "PRIVILEGED_ROLES",
    "can_force_release",
    "check_force_release",
    "check_list_owner",
    "may_read",
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


def may_read(role: str, principal: str, parties: Iterable[str]) -> bool:
    """Whether ``principal`` with ``role`` may read a record whose parties (a lease's
    owner; a handoff's sender and recipient) are ``parties``: a party may, and so may a
    role that :func:`sees_everything`."""
    return principal in parties or sees_everything(role)


def check_list_owner(role: str, principal: str, owner: str) -> None:
    """Check a listing of ``owner``'s leases (a name, or ``"*"`` for everyone's) by
    ``principal`` with ``role``.

    Raises:
        ForbiddenError: another principal's (or everyone's) leases, without the owner or
            admin role.
    """
    if owner != principal and not sees_everything(role):
        raise ForbiddenError("listing another principal's leases needs the owner or admin role")
