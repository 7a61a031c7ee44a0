"""When a lease block renews, when it must count its lease as lost, and how long it may keep
it (DESIGN.md "Prefect integration": the renew deadline). Pure: times are seconds on the
caller's monotonic clock; the keeper (``_client/keeper.py``) runs the timers.

A holder's lease is granted until the authority's ``now + TTL``; the holder only knows when
it *sent* the request that was confirmed. Counting the lease as lost at the **renew
deadline**, ``sent + renew_deadline_seconds`` (default two thirds of the TTL), leaves a
third of the TTL between the holder learning of its loss and the earliest moment anyone else
can be granted the resource, whatever a blocked network call is doing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prefect_baton._rules.validation import validate_ttl
from prefect_baton.errors import ValidationError

__all__ = ["RENEW_DEADLINE_FRACTION", "KeepTimes", "heartbeat_call_timeout", "keep_times"]

#: The default renew deadline as a fraction of the TTL.
RENEW_DEADLINE_FRACTION = 2 / 3
#: The default renewal interval as a fraction of the TTL.
RENEW_EVERY_FRACTION = 1 / 3


@dataclass(frozen=True)
class KeepTimes:
    """The timing of one lease block (seconds).

    Attributes:
        ttl: the lease TTL.
        renew_every: the pause between a confirmed renewal and the next one.
        renew_deadline: how long after the last confirmed grant or renewal was sent the
            lease counts as lost (``0 < renew_deadline < ttl``).
        max_hold: how long after the first grant renewals stop (``None``: no cap).
    """

    ttl: float
    renew_every: float
    renew_deadline: float
    max_hold: float | None

    def deadline(self, confirmed_sent_at: float) -> float:
        """The renew deadline after a grant or renewal whose request was sent at
        ``confirmed_sent_at`` (monotonic seconds) and confirmed."""
        return confirmed_sent_at + self.renew_deadline

    def may_renew(self, started_at: float, now: float) -> bool:
        """Whether a renewal may still be sent at ``now`` for a lease first granted (its
        acquire sent) at ``started_at``: false once ``max_hold`` seconds have passed."""
        return self.max_hold is None or now - started_at < self.max_hold


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(f"{name} must be a number of seconds")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise ValidationError(f"{name} must be a number of seconds > 0, got {value!r}")
    return v


def keep_times(
    ttl_seconds: object,
    *,
    renew_every_seconds: object = None,
    renew_deadline_seconds: object = None,
    max_hold_seconds: object = None,
) -> KeepTimes:
    """Validate a lease block's timing options and fill in the defaults.

    Args:
        ttl_seconds: the lease TTL (integer seconds, 10..86,400).
        renew_every_seconds: seconds between renewals (``None``: a third of the TTL, or half
            the renew deadline if that is shorter). One at or past the renew deadline means
            the lease is lost at the deadline (a way to test a loss).
        renew_deadline_seconds: seconds after the last confirmed renewal was sent at which
            the lease counts as lost (``None``: two thirds of the TTL); must be below the TTL.
        max_hold_seconds: stop renewing this many seconds after the first grant (``None``:
            renew for as long as the block runs).

    Raises:
        ValidationError: a value that is not a positive number of seconds, or a renew
            deadline not below the TTL.
    """
    ttl = validate_ttl(ttl_seconds) / 1000
    deadline = (
        ttl * RENEW_DEADLINE_FRACTION
        if renew_deadline_seconds is None
        else _seconds("renew_deadline_seconds", renew_deadline_seconds)
    )
    if deadline >= ttl:
        raise ValidationError(
            f"renew_deadline_seconds must be below the TTL ({ttl:g} s), got {deadline:g}"
        )
    every = (
        min(ttl * RENEW_EVERY_FRACTION, deadline / 2)
        if not renew_every_seconds
        else _seconds("renew_every_seconds", renew_every_seconds)
    )
    cap = None if max_hold_seconds is None else _seconds("max_hold_seconds", max_hold_seconds)
    return KeepTimes(ttl=ttl, renew_every=every, renew_deadline=deadline, max_hold=cap)


def heartbeat_call_timeout(ttl_seconds: float) -> float:
    """The longest one network call of a renewal may take (seconds): a quarter of the TTL,
    so that a renewal sent a third of the TTL after the last one ends (answered or timed
    out) before the default renew deadline at two thirds. Stores bound their renew calls by
    it (or by a fixed socket timeout below it for the shortest TTL, 10 s)."""
    return ttl_seconds / 4
