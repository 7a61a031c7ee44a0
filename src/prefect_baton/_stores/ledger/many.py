"""``b.leases.acquire_many``: claim several resources all-or-nothing.

On the Redis authority it is one script (:meth:`RedisAuthority.acquire_many
<prefect_baton._stores.redis.authority.RedisAuthority.acquire_many>`); on the ledger authority it is
one transaction that decides each resource exactly as
:meth:`LedgerStore.acquire <prefect_baton._stores.ledger.store.LedgerStore.acquire>` does (same
receipt, replay and decision steps, in the same order) and rolls back everything when one is
refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prefect_baton._rules import core as _core
from prefect_baton._stores.ledger.base import Tx
from prefect_baton._stores.ledger.leases import LeaseOps
from prefect_baton._stores.protocol import MAX_MANY, AcquireRequest, Caller, Execution
from prefect_baton.errors import BatonError, ValidationError
from prefect_baton.models import Lease

__all__ = ["ledger_acquire_many", "refused", "requests_of"]

_ITEM_FIELDS = {
    "resource_type",
    "resource_id",
    "ttl_seconds",
    "purpose",
    "scopes",
    "expected_version",
}


def requests_of(
    resources: Iterable[tuple[str, str] | Mapping[str, Any]],
    *,
    ttl_seconds: int,
    purpose: str | None,
    scopes: Iterable[str],
) -> list[AcquireRequest]:
    """Validate ``acquire_many``'s input into :class:`AcquireRequest` values.

    Each item is ``(resource_type, resource_id)`` or a mapping with those two keys and
    optionally ``ttl_seconds``, ``purpose``, ``scopes``, ``expected_version`` overriding the
    call's defaults.

    Raises:
        ValidationError: a bad item or an unknown field (the message ends ``(acquire_many
            item <index>)``, index from 0), a resource listed twice, no item, or more than
            1,000 items. Nothing is written.
    """
    if isinstance(resources, str | bytes | Mapping) or not isinstance(resources, Iterable):
        raise ValidationError("resources must be a list of (resource_type, resource_id) pairs")
    default_scopes = _core.validate_scopes(scopes)
    # The call's ttl and purpose are checked when an item first uses them (an item may
    # override both), then reused.
    defaults: dict[str, Any] = {}

    def default(name: str) -> Any:
        if name not in defaults:
            try:
                if name == "ttl":
                    defaults[name] = _core.validate_ttl(ttl_seconds)
                else:
                    defaults[name] = _core.validate_text("purpose", purpose)
            except ValidationError as exc:
                exc.call_level = True  # type: ignore[attr-defined]  # the call's, no item's
                raise
        return defaults[name]

    out: list[AcquireRequest] = []
    seen: set[tuple[str, str]] = set()
    for index, item in enumerate(resources):
        try:
            req = _request(item, default, default_scopes)
        except ValidationError as exc:
            if not getattr(exc, "call_level", False):
                _name_item(exc, f"acquire_many item {index}")
            raise
        rt, rid = req.resource_type, req.resource_id
        if (rt, rid) in seen:
            raise ValidationError(f"resource {rt}/{rid} is listed twice")
        seen.add((rt, rid))
        out.append(req)
    if not 1 <= len(out) <= MAX_MANY:
        raise ValidationError(f"acquire_many takes 1 to {MAX_MANY} resources")
    return out


def _request(
    item: Any, default: Callable[[str], Any], default_scopes: tuple[str, ...]
) -> AcquireRequest:
    """One ``acquire_many`` item as an :class:`AcquireRequest` (``default(name)`` gives the
    call's validated ``"ttl"`` or ``"purpose"``).

    Raises:
        ValidationError: a bad item or an unknown field.
    """
    if isinstance(item, tuple | list) and len(item) == 2:
        rt = _core.validate_id("resource_type", item[0])
        rid = _core.validate_id("resource_id", item[1])
        req = AcquireRequest(rt, rid, default("ttl"), default_scopes, default("purpose"), None)
    elif isinstance(item, Mapping):
        unknown = set(item) - _ITEM_FIELDS
        if unknown:
            raise ValidationError(f"unknown acquire_many fields: {', '.join(sorted(unknown))}")
        rt = _core.validate_id("resource_type", item.get("resource_type"))
        rid = _core.validate_id("resource_id", item.get("resource_id"))
        req = AcquireRequest(
            resource_type=rt,
            resource_id=rid,
            ttl_ms=(
                _core.validate_ttl(item["ttl_seconds"]) if "ttl_seconds" in item else default("ttl")
            ),
            scopes=(_core.validate_scopes(item["scopes"]) if "scopes" in item else default_scopes),
            purpose=(
                _core.validate_text("purpose", item["purpose"])
                if "purpose" in item
                else default("purpose")
            ),
            expected_version=_core.validate_version(
                "expected_version", item.get("expected_version")
            ),
        )
    else:
        raise ValidationError("each resource must be a (resource_type, resource_id) pair")
    return req


def refused(exc: BatonError, index: int, req: AcquireRequest) -> BatonError:
    """``exc``, the refusal of request ``index`` (0-based) of an ``acquire_many`` call, with
    its message naming that request: ``"<message> (acquire_many item <index>:
    <resource_type>/<resource_id>)"``. The same on every authority."""
    return _name_item(exc, f"acquire_many item {index}: {req.resource_type}/{req.resource_id}")


def _name_item(exc: BatonError, where: str) -> BatonError:
    """``exc`` with ``" (<where>)"`` appended to its message (and its ``args``)."""
    exc.message = f"{exc.message} ({where})"
    exc.args = (exc.message,)
    return exc


def ledger_acquire_many(
    store: LeaseOps,
    caller: Caller,
    requests: Sequence[AcquireRequest],
    execution: Execution,
) -> list[Lease]:
    """Acquire every request on the ledger authority in one transaction, or none, under
    ``execution`` (its key and attempt).

    Returns the leases in request order. Raises the error of the first refused request
    (as :meth:`LedgerStore.acquire`, its message naming the request: :func:`refused`); then
    nothing is written.
    """
    locks: list[str] = []
    for req in requests:
        locks += store._lease_locks(caller, req.resource_type, req.resource_id, bool(req.scopes))

    def op(tx: Tx) -> list[Lease]:
        out: list[Lease] = []
        for i, req in enumerate(requests):
            try:
                out.append(store._acquire_in_tx(tx, caller, req, execution))
            except BatonError as exc:
                raise refused(exc, i, req) from None
        return out

    return store._write(caller, locks, op, authority=True)
