"""The rules of outcomes that the decision core applies: which lease generation an outcome
is recorded under, and one ``succeeded`` outcome per generation. No I/O."""

from __future__ import annotations

from prefect_baton.errors import ConflictError, ValidationError

__all__ = ["check_outcome", "outcome_lease"]


def outcome_lease(lease_id: str | None, fence_lease_id: str | None) -> str | None:
    """The lease generation an outcome is recorded under: its ``lease_id`` link, or the
    fence's lease when it has no link (``None``: neither).

    Both name one generation or the outcome is refused: with a link to one lease and a
    fence on another, the rule of :func:`check_outcome` (one ``succeeded`` outcome per
    generation) would be checked against the link while the fence's generation did the
    work, so a caller holding one lease could record ``succeeded`` again and again by
    linking other leases of its own.

    Raises:
        ValidationError: ``lease_id`` and ``fence_lease_id`` are both given and differ.
    """
    if lease_id is not None and fence_lease_id is not None and lease_id != fence_lease_id:
        raise ValidationError(
            f"lease_id {lease_id!r} is not the fence's lease {fence_lease_id!r}: an outcome "
            "is recorded under one lease generation; link the fence's lease or give no "
            "lease_id"
        )
    return lease_id if lease_id is not None else fence_lease_id


def check_outcome(
    status: str, subject_id: str, lease_id: str | None, *, succeeded_before: bool
) -> None:
    """A second ``succeeded`` outcome of one subject under one lease generation is refused.

    The first ``succeeded`` outcome recorded for ``subject_id`` with a lease generation
    (``lease_id``, or the fence's) settles that generation's work; another one (a redundant
    resume, a relayed event acted on twice) would count the work twice, so it is refused
    with ``CONFLICT`` and nothing is written. An exact retry with the same idempotency key
    replays the first receipt instead and never gets here. Outcomes without a lease, and
    ``failed`` / ``cancelled`` ones, are not limited.

    Args:
        status: the new outcome's status. subject_id: its subject.
        lease_id: the lease generation it is recorded under, or ``None``.
        succeeded_before: a ``succeeded`` outcome of ``subject_id`` under ``lease_id``
            exists already.

    Raises:
        ConflictError: ``status`` is ``succeeded`` and ``succeeded_before``.
    """
    if status == "succeeded" and lease_id is not None and succeeded_before:
        raise ConflictError(f"{subject_id} already has a succeeded outcome under lease {lease_id}")
