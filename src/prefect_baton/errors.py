"""Errors raised by prefect-baton.

Every error derives from :class:`BatonError` and carries a stable ``code`` taken from the
design's list (``VALIDATION_ERROR``, ``CONFLICT``, ``VERSION_CONFLICT``, ``NOT_FOUND``,
``FORBIDDEN``, ``IDEMPOTENCY_MISMATCH``, ``IDEMPOTENCY_IN_FLIGHT``, ``LEASE_LOST``,
``STALE_FENCE``, ``UNAVAILABLE``). Every surface (Python, CLI, REST) reports the same codes.

One more code belongs to the network surface only: ``UNAUTHENTICATED``
(:class:`UnauthenticatedError`), raised by a client of the REST API whose bearer key is
missing, unknown or revoked (HTTP ``401``). It is not in :data:`ERROR_CODES`, which lists the
outcomes of coordination operations; nor is ``INTERNAL_ERROR`` (:class:`InternalError`), an
unexpected failure inside prefect-baton.

No other exception leaves the library, the CLI, the REST API or the MCP server: each of
them turns anything else into a :class:`BatonError` with :func:`as_baton_error`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any, ClassVar

from prefect_baton.models import wire_time

__all__ = [
    "ERROR_CODES",
    "BatonError",
    "ConflictError",
    "ForbiddenError",
    "IdempotencyInFlightError",
    "IdempotencyMismatchError",
    "InternalError",
    "LeaseLostError",
    "NotFoundError",
    "StaleFenceError",
    "UnauthenticatedError",
    "UnavailableError",
    "ValidationError",
    "VersionConflictError",
    "as_baton_error",
    "error_for_code",
    "from_pydantic",
]


class BatonError(Exception):
    """Root of every prefect-baton error.

    Attributes:
        code: stable machine-readable code (``str``), one of :data:`ERROR_CODES`.
        message: human-readable explanation (``str``); never names another principal's
            lease holder, purpose or scopes.
    """

    code: ClassVar[str] = "BATON_ERROR"
    #: The error's extra fields (attribute names), in the order :meth:`to_dict` adds them.
    details: ClassVar[tuple[str, ...]] = ()

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"code": ..., "message": ...}`` plus the error's extra fields
        (:attr:`details`) that are not ``None``, a time as wire text (``wire_time``)."""
        d: dict[str, Any] = {"code": self.code, "message": self.message}
        for name in self.details:
            value = getattr(self, name, None)
            if value is not None:
                d[name] = wire_time(value) if isinstance(value, datetime) else value
        return d

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.__dict__.copy()))


def _rebuild(cls: type[BatonError], state: dict[str, Any]) -> BatonError:
    err = cls.__new__(cls)
    Exception.__init__(err, state.get("message", ""))
    err.__dict__.update(state)
    return err


class ValidationError(BatonError):
    """Bad input (TTL out of 10..86,400 s, empty or over-long id, non-JSON state, ...).

    Nothing is written and no idempotency receipt is stored for a request that fails
    validation.
    """

    code = "VALIDATION_ERROR"


class ConflictError(BatonError):
    """The resource is leased by another holder, or its write scopes overlap another lease.

    Attributes:
        expires_at: when the conflicting lease runs out (timezone-aware UTC). The message
            gives this expiry and nothing else (seed service rule: no holder, no purpose).
    """

    code = "CONFLICT"
    details = ("expires_at",)

    def __init__(self, message: str, *, expires_at: datetime | None = None) -> None:
        super().__init__(message)
        self.expires_at = expires_at


class VersionConflictError(BatonError):
    """A compare-and-swap failed: ``expected_version`` differs from the current version.

    Attributes:
        current_version: the version the authority holds (``int``).
        expected_version: the version the caller presented (``int``).
    """

    code = "VERSION_CONFLICT"
    details = ("current_version", "expected_version")

    def __init__(self, message: str, *, current_version: int, expected_version: int) -> None:
        super().__init__(message)
        self.current_version = current_version
        self.expected_version = expected_version


class NotFoundError(BatonError):
    """The object does not exist, is no longer in the state the operation needs, or belongs
    to another organization (another org's ids are always not found, never a conflict)."""

    code = "NOT_FOUND"


class ForbiddenError(BatonError):
    """The caller's role or identity does not allow the operation (e.g. force release by an
    ``agent``, deleting another principal's checkpoint). A resolve by anyone but the
    handoff's target is the seed service's :class:`ValidationError` instead."""

    code = "FORBIDDEN"


class IdempotencyMismatchError(BatonError):
    """The idempotency key was used before for a different request; nothing was written."""

    code = "IDEMPOTENCY_MISMATCH"


class IdempotencyInFlightError(BatonError):
    """A request with the same idempotency key is still being processed."""

    code = "IDEMPOTENCY_IN_FLIGHT"


class LeaseLostError(BatonError):
    """The caller's lease is no longer held: it expired, was released, force-released,
    transferred or taken over. Renewing, releasing or replaying it cannot bring it back.

    Attributes:
        status: how the lease generation ended, when the refusal knows it (``str`` or
            ``None``): ``"transferred"`` (moved to another principal, e.g. by an accepted
            handoff), ``"expired"``, ``"released"``, ``"taken_over"``, ``"revoked"``,
            ``"superseded"``, or ``"gone"`` (no such generation any more). The message names
            it too.
    """

    code = "LEASE_LOST"
    details = ("status",)

    def __init__(self, message: str, *, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status


class StaleFenceError(BatonError):
    """A write carried a lease as fencing token, and that lease generation is no longer the
    current effective one for its resource; or a guard of :mod:`prefect_baton.fencing` where
    the write lands has already accepted a higher fencing token for the resource."""

    code = "STALE_FENCE"


class UnavailableError(BatonError):
    """The lease authority or ledger cannot be reached, or is rebuilding after data loss.
    The operation had no effect that the caller can rely on; retry it with the same
    idempotency key."""

    code = "UNAVAILABLE"


class UnauthenticatedError(BatonError):
    """The REST API refused the bearer key (HTTP ``401``: missing, unknown or revoked).
    Raised by a client built with ``Baton(api_url=..., api_key=...)``; nothing was done."""

    code = "UNAUTHENTICATED"


class InternalError(BatonError):
    """An unexpected failure inside prefect-baton (a bug, not the caller's input): code
    ``INTERNAL_ERROR``, HTTP ``500``, exit status 1. What was written is unknown; the
    ledger's transactions keep it consistent. Made by :func:`as_baton_error`."""

    code = "INTERNAL_ERROR"


#: Top-level packages whose exceptions mean a store or its connection failed (the ledger's
#: database drivers, Redis, the REST client's HTTP stack): ``UNAVAILABLE``.
_DRIVERS = frozenset(("sqlalchemy", "psycopg", "sqlite3", "redis", "httpx", "httpcore"))


def as_baton_error(exc: BaseException, *, expose: bool = True) -> BatonError:
    """The :class:`BatonError` an exception leaves a surface as: ``exc`` itself when it is
    one; :class:`UnavailableError` for a failure of a store or its connection (an exception
    of a database driver, SQLAlchemy, Redis or the HTTP client, or a ``ConnectionError`` /
    ``TimeoutError``: retry with the same idempotency key); :class:`InternalError` for
    anything else. The one rule every surface applies (the client, ``baton``, the REST API,
    the MCP server).

    Args:
        exc: the exception caught.
        expose: put the exception's type and text into the message (``True``, for the
            trusted in-process surfaces); ``False`` for the network surfaces, whose callers
            must not see internals (the caller logs the exception). With ``False`` an error
            this function made earlier with ``expose`` (the client's boundary, below a
            network surface) is made again from its cause without them.
    """
    if isinstance(exc, BatonError):
        cause = exc.__cause__
        if not expose and exc.__dict__.get("_converted") and cause is not None:
            return as_baton_error(cause, expose=False)
        return exc
    name = type(exc).__name__
    driver = isinstance(exc, ConnectionError | TimeoutError) or any(
        c.__module__.partition(".")[0] in _DRIVERS for c in type(exc).__mro__
    )
    err: BatonError
    if driver:
        detail = f" ({name}: {exc})" if expose else ""
        err = UnavailableError(f"a store (the ledger or Redis) failed{detail}; retry")
    else:
        err = InternalError(f"internal error ({name}: {exc})" if expose else "internal error")
    err.__dict__["_converted"] = True
    return err


def from_pydantic(
    exc: Any,
    prefix: str = "",
    *,
    skip: Collection[str] = (),
    root: str = "input",
    name: Callable[[tuple[Any, ...]], str] | None = None,
    messages: Mapping[str, str] | None = None,
) -> ValidationError:
    """The :class:`ValidationError` for a pydantic validation error ``exc`` (a
    ``pydantic.ValidationError`` or FastAPI's ``RequestValidationError``: anything with
    ``errors()``), in one line: ``field: message`` per problem (at most five), ``"; "``
    between them, without pydantic's multi-line layout or documentation URL. The one
    conversion of every surface (client arguments, REST requests, MCP tool arguments,
    settings).

    Args:
        exc: the pydantic error.
        prefix: put before the problems (``str``, e.g. ``"bad evidence item: "``).
        skip: location parts left out of the field name (``{"body"}`` for REST bodies).
        root: the field name of a problem at the top level (``str``).
        name: makes the field name from a location (default: its parts joined by ``.``).
        messages: a replacement message per ``pattern`` of a ``string_pattern_mismatch``.

    A body that is not JSON at all (FastAPI's ``json_invalid``, located at the offset of
    the fault) reads ``<root>: invalid JSON at byte N (reason)``.
    """
    parts = []
    for err in exc.errors()[:5]:
        if err.get("type") == "json_invalid" and _is_offset(err.get("loc", ())):
            parts.append(_json_decode_problem(exc, err, root))
            continue
        loc = tuple(x for x in err.get("loc", ()) if x not in skip)
        field = name(loc) if name is not None else ".".join(str(x) for x in loc)
        msg = str(err.get("msg") or "invalid")
        pattern = (err.get("ctx") or {}).get("pattern")
        if messages and pattern is not None:
            msg = messages.get(str(pattern), msg)
        parts.append(f"{field or root}: {msg}")
    return ValidationError(prefix + ("; ".join(parts) or f"invalid {root}"))


def _is_offset(loc: Any) -> bool:
    # FastAPI reports a body that is not JSON at ``("body", <offset>)``.
    return isinstance(loc, tuple | list) and len(loc) == 2 and isinstance(loc[1], int)


def _json_decode_problem(exc: Any, err: Mapping[str, Any], root: str) -> str:
    """``body: invalid JSON at byte N (reason)`` for FastAPI's ``json_invalid`` error,
    whose location holds the offset in the decoded text: counted in bytes of the body
    (UTF-8) when the text is at hand."""
    pos = int(err["loc"][1])
    doc = getattr(exc, "body", None)
    if isinstance(doc, str):
        pos = len(doc[:pos].encode("utf-8", "surrogatepass"))
    reason = str((err.get("ctx") or {}).get("error") or err.get("msg") or "malformed")
    return f"{root}: invalid JSON at byte {pos} ({reason})"


_BY_CODE: dict[str, type[BatonError]] = {
    cls.code: cls
    for cls in (
        ValidationError,
        ConflictError,
        VersionConflictError,
        NotFoundError,
        ForbiddenError,
        IdempotencyMismatchError,
        IdempotencyInFlightError,
        LeaseLostError,
        StaleFenceError,
        UnavailableError,
    )
}

#: Every stable error code, in the order the design lists them.
ERROR_CODES: tuple[str, ...] = tuple(_BY_CODE)


def error_for_code(code: str, message: str, **fields: Any) -> BatonError:
    """Build the error class for ``code`` (``str``) with ``message``; unknown codes give a
    plain :class:`BatonError`. Used to re-raise errors stored in receipts or sent over HTTP."""
    cls = _BY_CODE.get(code)
    if code in (UnauthenticatedError.code, InternalError.code):
        cls = UnauthenticatedError if code == UnauthenticatedError.code else InternalError
    if cls is None:
        return BatonError(message)
    if cls is VersionConflictError:
        return VersionConflictError(
            message,
            current_version=int(fields.get("current_version", 0)),
            expected_version=int(fields.get("expected_version", 0)),
        )
    if cls is ConflictError:
        exp = fields.get("expires_at")
        return ConflictError(
            message, expires_at=datetime.fromisoformat(exp) if isinstance(exp, str) else exp
        )
    if cls is LeaseLostError:
        status = fields.get("status")
        return LeaseLostError(message, status=status if isinstance(status, str) else None)
    return cls(message)
