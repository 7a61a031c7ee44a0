"""What the client's operations record: :func:`observed` runs one operation of a client
group (``leases.acquire``, ``handoffs.resolve``, ...) and records its outcome.

It is called by the client's error boundary (:func:`prefect_baton._client.api_base.guarded`),
which every operation of every surface passes through (the Python API, the CLI, the REST
server's and the MCP server's clients, the Prefect integration), only while metrics are
enabled. A client over the REST API (``api_url``) records nothing here: the server that
decides the operation counts it, so nothing is counted twice.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any, TypeVar

from prefect_baton.metrics._state import record
from prefect_baton.models import Handoff, Lease, Receipt

__all__ = ["acquire_result", "observed"]

R = TypeVar("R")

#: The ``result`` label of a refused acquire, by the error's stable code
#: (:data:`prefect_baton.errors.ERROR_CODES`, lower case).
_ACQUIRE_RESULTS = {
    "version_conflict": "version_conflict",
    "conflict": "conflict",
    "idempotency_in_flight": "in_flight",
    "lease_lost": "lost",
}

#: Where a fenced ledger write is rejected, by client operation.
_FENCED = {
    "checkpoints.save": "checkpoint",
    "outcomes.record": "outcome",
    "handoffs.create": "handoff",
}


def acquire_result(lease: Lease | None, error: BaseException | None) -> str:
    """The ``result`` label of an acquire: ``granted`` or ``replayed`` for ``lease``, else
    the kind of ``error`` (``conflict``, ``version_conflict``, ``in_flight``, ``lost``,
    ``error``)."""
    if lease is not None:
        return "replayed" if lease.replayed else "granted"
    return _ACQUIRE_RESULTS.get(_code(error), "error")


@cache
def _signature(method: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(method)


def _resource_type(obj: Any) -> str:
    """The resource type of a lease (or lease block), ``""`` for anything else."""
    value = getattr(obj, "resource_type", None) if obj is not None else None
    return value if isinstance(value, str) else ""


def _code(error: BaseException | None) -> str:
    """The error's stable code in lower case (``internal_error`` for an exception that is
    not a :class:`~prefect_baton.errors.BatonError`, or for none)."""
    return str(getattr(error, "code", "internal_error")).lower()


@dataclass(frozen=True)
class _Call:
    """One call of a client operation: its name (``leases.acquire``), the caller's
    organization, and the method with the arguments it was given."""

    name: str
    org: str
    method: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def argument(self, name: str) -> Any:
        """The argument ``name`` of the call (``None`` if absent)."""
        try:
            bound = _signature(self.method).bind_partial(*self.args, **self.kwargs)
        except TypeError:
            return None
        return bound.arguments.get(name)


def observed(
    name: str,
    run: Callable[..., R],
    method: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> R:
    """Run ``run(*args, **kwargs)`` (the guarded client ``method`` named ``name``, e.g.
    ``"leases.acquire"``; ``args[0]`` is the operation group) and record its outcome on the
    instruments of :mod:`prefect_baton.metrics._specs`; returns what it returned and raises
    what it raised."""
    api = args[0] if args else None
    baton = getattr(api, "_b", None)
    stores = getattr(baton, "_stores", None)
    if baton is None or getattr(stores, "store", None) is None:
        return run(*args, **kwargs)  # a REST API client: its server counts the operation
    call = _Call(name, baton.caller.org, method, args, kwargs)
    started = time.perf_counter()
    try:
        result = run(*args, **kwargs)
    except BaseException as exc:
        _record(call, None, exc, time.perf_counter() - started)
        raise
    _record(call, result, None, time.perf_counter() - started)
    return result


def _acquired(org: str, resource_type: str, outcome: str, seconds: float) -> None:
    record("baton_acquires", org, resource_type, outcome)
    record("baton_acquire_seconds", org, resource_type, outcome, value=seconds)


def _record(call: _Call, result: Any, error: BaseException | None, seconds: float) -> None:
    name, org = call.name, call.org
    if name == "leases.acquire":
        lease = result if isinstance(result, Lease) else None
        rt = lease.resource_type if lease is not None else ""
        if lease is None and _code(error) != "validation_error":
            rt = str(call.argument("resource_type") or "")
        _acquired(org, rt, acquire_result(lease, error), seconds)
    elif name == "leases.acquire_many":
        if isinstance(result, list):
            for lease in result:
                _acquired(org, lease.resource_type, acquire_result(lease, None), seconds)
        elif error is not None:
            _acquired(org, "", acquire_result(None, error), seconds)
    elif name == "leases.renew":
        rt = _resource_type(call.argument("lease"))
        if error is None:
            record("baton_renewals", org, rt)
        else:
            record("baton_renew_failures", org, rt, _code(error))
    elif name in ("leases.release", "leases.release_by_id", "leases.force_release"):
        _record_release(call, result, error)
    elif name == "handoffs.create" and isinstance(result, Handoff):
        record("baton_handoffs", org, "created")
    elif name == "handoffs.resolve" and isinstance(result, Handoff) and not result.replayed:
        record("baton_handoffs", org, result.status)
        if result.resolved_at is not None:
            waited = (result.resolved_at - result.created_at).total_seconds()
            record("baton_handoff_resolve_seconds", org, result.status, value=max(0.0, waited))
    if _code(error) == "stale_fence" and name in _FENCED:
        fence = call.argument("lease" if name == "handoffs.create" else "fence")
        record("baton_stale_fence_rejections", org, _resource_type(fence), _FENCED[name])


def _record_release(call: _Call, result: Any, error: BaseException | None) -> None:
    org = call.org
    if isinstance(result, Receipt):
        lease = result.lease
        status = "forced" if result.forced and result.status == "released" else result.status
        record("baton_releases", org, lease.resource_type, status)
        if result.status in ("released", "expired") and not result.replayed:
            ended = lease.expires_at if result.status == "expired" else lease.released_at
            held = (ended or datetime.now(UTC)) - lease.acquired_at
            record(
                "baton_hold_seconds",
                org,
                lease.resource_type,
                value=max(0.0, held.total_seconds()),
            )
    elif error is not None:
        record("baton_releases", org, _resource_type(call.argument("lease")), _code(error))
