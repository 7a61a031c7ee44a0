"""Fenced writes to object stores with conditional writes (a generation or ETag
precondition): read the object's token, check it, write only if the object is unchanged."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from prefect_baton._rules.validation import validate_version
from prefect_baton.errors import ValidationError
from prefect_baton.fencing._token import Fenceable, FencingToken, checked_token

__all__ = [
    "METADATA_KEY",
    "PreconditionFailed",
    "StoredObject",
    "conditional_put",
    "object_metadata",
    "token_from_metadata",
]

P = TypeVar("P")
R = TypeVar("R")

#: The object metadata key holding the fencing token of the write that made the object
#: (letters, digits and ``_`` only, which S3, Google Cloud Storage and Azure Blob all take).
METADATA_KEY = "baton_fencing_token"


class PreconditionFailed(Exception):
    """Raise it from the ``write`` of :func:`conditional_put` when the store refused the
    write's precondition (HTTP ``412 Precondition Failed``: the object changed since it was
    read), unless you pass ``precondition_failed=`` to recognise your SDK's own error."""


@dataclass(frozen=True, slots=True)
class StoredObject(Generic[P]):
    """What :func:`conditional_put` needs to know about the object as it stands.

    Attributes:
        token: the fencing token stored with it (:func:`token_from_metadata`), ``None`` if
            the object does not exist or carries none.
        precondition: what makes the write conditional on the object being unchanged: its
            ETag, its generation, or a marker for "does not exist" (``If-None-Match: *``,
            generation ``0``).
    """

    token: int | None
    precondition: P


def object_metadata(fence: Fenceable) -> dict[str, str]:
    """The metadata to store with an object written under ``fence``:
    ``{"baton_fencing_token": "<epoch>"}``.

    Raises:
        ValidationError: ``fence`` names no resource and epoch.
    """
    return {METADATA_KEY: str(FencingToken.of(fence).epoch)}


def token_from_metadata(metadata: Mapping[str, str] | None) -> int | None:
    """The fencing token stored in an object's metadata (key :data:`METADATA_KEY`, any case,
    as stores differ), or ``None`` when there is none.

    Raises:
        ValidationError: the stored value is not a decimal integer from 0 to 2**53 - 1.
    """
    if not metadata:
        return None
    values = [v for k, v in metadata.items() if k.lower() == METADATA_KEY]
    if not values:
        return None
    raw = values[0].strip()
    if not raw.isascii() or not raw.isdigit():
        raise ValidationError(f"object metadata {METADATA_KEY}={raw[:40]!r} is not an integer")
    return validate_version(METADATA_KEY, int(raw))


def _is_precondition_failed(exc: BaseException) -> bool:
    return isinstance(exc, PreconditionFailed)


def conditional_put(
    fence: Fenceable,
    read: Callable[[], StoredObject[P]],
    write: Callable[[P], R],
    *,
    attempts: int = 3,
    precondition_failed: Callable[[BaseException], bool] = _is_precondition_failed,
) -> R:
    """Write an object under ``fence`` unless a newer holder has written it.

    For stores with conditional writes (a write that fails with ``412`` unless the object
    is still at a given ETag or generation): Google Cloud Storage (``if_generation_match``),
    Amazon S3 (``If-Match`` / ``If-None-Match: *`` on ``PutObject``), Azure Blob Storage
    (``If-Match`` / ``If-None-Match: *``), and HTTP servers honouring ``If-Match``. A store
    without them cannot be fenced this way: the gap between the check and the write is
    the race a fence closes.

    Each attempt: ``read()`` the object's stored token and precondition; refuse with
    :class:`~prefect_baton.errors.StaleFenceError` if a higher token wrote it (the rule of
    :func:`~prefect_baton.fencing.guard`: equal passes, lower fails); else
    ``write(precondition)``, which must store :func:`object_metadata` with the object and
    make the write conditional on ``precondition``. If the store refuses the precondition
    (someone wrote in between), read and check again, at most ``attempts`` times.

    Args:
        fence: the lease the write is made under (a :class:`~prefect_baton.models.Lease`,
            the lease block or a :class:`~prefect_baton.fencing.FencingToken`).
        read: returns the object's :class:`StoredObject` (token ``None`` and a
            "must not exist" precondition when it does not exist).
        write: writes the object on the given precondition and returns what you like.
        attempts: how many read-check-write rounds to try (``int``, 1 to 100; default 3).
        precondition_failed: tells a refused precondition from other errors of ``write``
            (default: it is a :class:`PreconditionFailed`).

    Returns:
        What ``write`` returned.

    Raises:
        StaleFenceError: a higher token has written the object (nothing was written).
        ValidationError: bad arguments, or a malformed stored token.
        Exception: ``write``'s own error: any that is not a refused precondition, and the
            last refused precondition when every attempt was refused.
    """
    token = FencingToken.of(fence)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100:
        raise ValidationError("attempts must be an integer from 1 to 100")
    for attempt in range(1, attempts + 1):
        current = read()
        checked_token(current.token, token, "object")
        try:
            return write(current.precondition)
        except Exception as exc:
            if attempt == attempts or not precondition_failed(exc):
                raise
    raise AssertionError("unreachable")  # pragma: no cover
