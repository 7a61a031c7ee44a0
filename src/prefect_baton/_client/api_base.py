"""Shared pieces of the client surface: argument coercion and the API base class."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, runtime_checkable

from prefect_baton._client.keeper import LeaseKeeper
from prefect_baton._rules import core as _core
from prefect_baton._rules.core import Proof
from prefect_baton._rules.validation import validate_limit
from prefect_baton._stores.protocol import Caller, RecordStore
from prefect_baton.errors import BatonError, ValidationError, as_baton_error
from prefect_baton.metrics import _state as _metrics_state
from prefect_baton.models import Lease

if TYPE_CHECKING:
    from prefect_baton._client.sync import Baton

P = ParamSpec("P")
R = TypeVar("R")

HANDOFF_RESOLUTIONS = ("accepted", "rejected")
OUTCOME_STATUSES = ("succeeded", "failed", "cancelled")


@runtime_checkable
class FenceLike(Protocol):
    """Anything that names a lease generation: a :class:`Lease` or a :class:`LeaseKeeper`."""

    @property
    def lease_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...


LeaseLike = Lease | LeaseKeeper


def _lease_of(lease: object) -> Lease:
    if isinstance(lease, LeaseKeeper):
        return lease.lease
    if isinstance(lease, Lease):
        return lease
    raise ValidationError(f"expected a Lease, got {type(lease).__name__}")


def _fence_lease(fence: object) -> Lease | None:
    """The lease a ``fence=`` argument names (``None`` for none).

    Raises:
        ValidationError: ``fence`` is neither a :class:`Lease` nor a lease block.
        RuntimeError: a lease block not entered yet.
    """
    if fence is None:
        return None
    if isinstance(fence, Lease | LeaseKeeper):
        return _lease_of(fence)
    raise ValidationError(f"fence must be a Lease (or the lease block), got {type(fence).__name__}")


#: The client's check of a ``limit`` argument (``ValidationError`` unless an ``int`` from 1
#: to the maximum), :func:`~prefect_baton._rules.validation.validate_limit`.
_limit = validate_limit


class _Identity:
    """The identity properties of a client (:class:`Baton`, :class:`AsyncBaton`), read from
    its :class:`Caller` (``caller``, set by the client's constructor)."""

    caller: Caller

    @property
    def org(self) -> str:
        """The organization id (``str``)."""
        return self.caller.org

    @property
    def principal(self) -> str:
        """The acting identity (``str``)."""
        return self.caller.principal

    @property
    def role(self) -> str:
        """The role: ``agent``, ``owner`` or ``admin``."""
        return self.caller.role


def _binding_error(
    method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str | None:
    """Why ``method(*args, **kwargs)`` cannot bind its arguments (an unexpected keyword, a
    missing or surplus positional argument), or ``None`` when the call binds."""
    try:
        inspect.signature(method).bind(*args, **kwargs)
    except TypeError as exc:
        return str(exc)
    return None


def guarded(method: Callable[P, R]) -> Callable[P, R]:
    """``method`` with the library's error boundary: an exception that is not a
    :class:`BatonError` leaves it as :func:`prefect_baton.errors.as_baton_error` says
    (``UNAVAILABLE`` for a driver error, ``INTERNAL_ERROR`` otherwise), chained to the
    original. A call whose arguments do not fit ``method``'s signature (checked with
    :meth:`inspect.Signature.bind` once a ``TypeError`` arises, so a good call pays
    nothing) is the caller's mistake: :class:`ValidationError` naming the method and the
    problem; the method did not run. While metrics are enabled
    (:func:`prefect_baton.metrics.enable`), the outcome of the call is recorded
    (:func:`prefect_baton.metrics._calls.observed`)."""
    group, _, attr = method.__qualname__.rpartition(".")  # "LeaseAPI.acquire"
    name = f"{group.removesuffix('API').lower()}s.{attr}" if group.endswith("API") else attr

    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        if _metrics_state.SINKS:  # metrics enabled: record the outcome (see metrics._calls)
            from prefect_baton.metrics._calls import observed

            return observed(name, checked, method, args, kwargs)
        return checked(*args, **kwargs)

    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except BatonError:
            raise
        except TypeError as exc:
            problem = _binding_error(method, args, kwargs)
            if problem is None:
                raise as_baton_error(exc) from exc
            raise ValidationError(f"bad call of {name}(): {problem}") from None
        except Exception as exc:
            raise as_baton_error(exc) from exc

    return call


class _API:
    """Base of the client's operation groups (``b.leases``, ``b.checkpoints``, ...): every
    public method a subclass defines is :func:`guarded`, so only :class:`BatonError`
    leaves it (the async client runs these same methods)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in list(vars(cls).items()):
            if not name.startswith("_") and inspect.isfunction(value):
                setattr(cls, name, guarded(value))

    def __init__(self, baton: Baton) -> None:
        self._b = baton

    @property
    def _caller(self) -> Caller:
        return self._b.caller

    def _proof(self, lease: object) -> Proof:
        """The proof of holding ``lease`` (a :class:`Lease` or lease block) as this caller.

        Raises:
            ValidationError: ``lease`` is not a lease, or one inherited across ``fork()``
                (only the process that acquired it may renew, transfer or release it), or
                its id or execution key breaks the id rules
                (:func:`~prefect_baton._rules.validation.validate_id`: a proof built from
                outside input, such as a REST body's ``execution_key``).
        """
        lease_ = _lease_of(lease)
        if not lease_.made_in_this_process:
            raise ValidationError(
                f"lease {lease_.lease_id} was inherited across fork(): only the process that "
                "acquired it may renew, transfer or release it"
            )
        return Proof(
            _core.validate_id("lease_id", lease_.lease_id),
            self._caller.principal,
            _core.validate_optional_id("execution_key", lease_.execution_key),
        )

    @property
    def _store(self) -> RecordStore:
        """The record store, once it sees this client's lease transitions."""
        self._b._ledger_barrier()
        return self._b._records
