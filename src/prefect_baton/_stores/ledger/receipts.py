"""Idempotency receipts for the mutations whose authority keeps none itself: release (by
proof and by id), renew, transfer, force release and handoff resolve.

:func:`run_once` wraps one such operation, for any lease authority (the ledger, Redis, or,
on the REST server behind a remote client, either of them), in two ledger transactions
around the operation:

1. look up the receipt of ``(org, principal, operation, key, scope)`` in
   ``baton_receipts``: complete with the same request digest: return the stored response,
   marked ``replayed``; another digest: :class:`IdempotencyMismatchError`; an in-flight
   claim younger than :data:`CLAIM_TIMEOUT_SECONDS`: :class:`IdempotencyInFlightError`;
   otherwise insert a claim (or take over a lapsed one or an expired receipt);
2. run the operation; if it raises a :class:`~prefect_baton.errors.BatonError`, delete the
   claim (nothing stored, as for a request that failed validation) and re-raise;
3. store the response (the model's JSON) with the receipt retention as its expiry.

A claim is a ``baton_receipts`` row whose ``response`` is :data:`IN_FLIGHT` (the empty
string) and whose ``expires_at_ms`` is the claim expiry. Crash window: a process that dies
after the operation but before step 3 leaves a claim that lapses after
:data:`CLAIM_TIMEOUT_SECONDS`; a retry then runs the operation again and gets that
operation's own answer (a second release by proof is ``no_change``, a renew extends again,
a transfer is ``LEASE_LOST``, a resolve is ``NOT_FOUND``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

from pydantic import BaseModel
from sqlalchemy import delete, select, update
from sqlmodel import col

from prefect_baton._rules.digests import operation_digest
from prefect_baton._stores.ledger.tables import ReceiptRow
from prefect_baton._stores.protocol import Caller, Idempotency
from prefect_baton.errors import BatonError, IdempotencyInFlightError, IdempotencyMismatchError

if TYPE_CHECKING:
    from prefect_baton._stores.ledger.base import StoreBase, Tx

M = TypeVar("M", bound=BaseModel)
P = ParamSpec("P")

#: How long a claim (an operation started under a key and not yet answered) blocks a
#: concurrent duplicate with ``IDEMPOTENCY_IN_FLIGHT``, in seconds; after that a retry may
#: take the claim over and run the operation again.
CLAIM_TIMEOUT_SECONDS = 60

#: The ``response`` of a claim row (a complete receipt holds JSON, never the empty string).
IN_FLIGHT = ""


def _identity(caller: Caller, operation: str, key: str, scope: str) -> dict[str, Any]:
    """The columns of ``baton_receipts`` that identify a receipt, with their values."""
    return {
        "org_id": caller.org,
        "principal": caller.principal,
        "operation": operation,
        "idem_key": key,
        "scope_key": scope,
    }


def receipt_identity(caller: Caller, operation: str, key: str, scope: str) -> list[Any]:
    """The ``WHERE`` conditions of the receipt of ``(caller.org, caller.principal,
    operation, key, scope)`` in ``baton_receipts``."""
    identity = _identity(caller, operation, key, scope)
    return [col(getattr(ReceiptRow, name)) == value for name, value in identity.items()]


def receipt_row(
    caller: Caller,
    operation: str,
    key: str,
    scope: str,
    digest: str,
    *,
    response: str,
    now_ms: int,
    expires_at_ms: int,
) -> ReceiptRow:
    """A new ``baton_receipts`` row of ``(caller.org, caller.principal, operation, key,
    scope)`` for the request digested as ``digest``: a claim (``response`` is
    :data:`IN_FLIGHT`) or a complete receipt (``response``: the stored JSON), created at
    ``now_ms`` and expiring at ``expires_at_ms`` (epoch milliseconds)."""
    return ReceiptRow(
        **_identity(caller, operation, key, scope),
        request_digest=digest,
        response=response,
        created_at_ms=now_ms,
        expires_at_ms=expires_at_ms,
    )


def _claim(
    store: StoreBase, caller: Caller, operation: str, key: str, scope: str, digest: str
) -> tuple[int, None] | tuple[None, dict[str, Any]]:
    """Step 1: ``(claim row id, None)`` to run the operation, or ``(None, response)`` for
    an exact retry of a completed one."""

    def op(tx: Tx) -> tuple[int, None] | tuple[None, dict[str, Any]]:
        row = tx.session.execute(
            select(ReceiptRow).where(*receipt_identity(caller, operation, key, scope))
        ).scalar_one_or_none()
        if row is not None and row.expires_at_ms <= tx.now_ms:
            tx.session.delete(row)  # an expired receipt or a lapsed claim
            tx.session.flush()
            row = None
        if row is not None:
            if row.request_digest != digest:
                raise IdempotencyMismatchError(
                    f"idempotency key {key!r} was used for a different {operation} request"
                )
            if row.response == IN_FLIGHT:
                raise IdempotencyInFlightError(
                    f"a {operation} request with idempotency key {key!r} is still in flight; "
                    f"retry later (a claim lapses after {CLAIM_TIMEOUT_SECONDS} s)"
                )
            stored: dict[str, Any] = json.loads(row.response)
            return None, stored
        claim = receipt_row(
            caller,
            operation,
            key,
            scope,
            digest,
            response=IN_FLIGHT,
            now_ms=tx.now_ms,
            expires_at_ms=tx.now_ms + CLAIM_TIMEOUT_SECONDS * 1000,
        )
        tx.session.add(claim)
        tx.session.flush()
        assert claim.id is not None
        return claim.id, None

    lock = f"receipt:{caller.org}:{caller.principal}:{operation}:{key}:{scope}"
    return store._write(caller, [lock], op)


def _complete(store: StoreBase, caller: Caller, claim_id: int, response: str) -> None:
    """Step 3: turn the claim into the receipt (a claim taken over meanwhile is left)."""

    def op(tx: Tx) -> None:
        tx.session.execute(
            update(ReceiptRow)
            .where(col(ReceiptRow.id) == claim_id, col(ReceiptRow.response) == IN_FLIGHT)
            .values(response=response, expires_at_ms=tx.now_ms + store.receipt_retention_ms)
        )

    store._write(caller, [], op)


def _drop(store: StoreBase, caller: Caller, claim_id: int) -> None:
    """Delete the claim of an operation that failed: nothing is stored."""

    def op(tx: Tx) -> None:
        tx.session.execute(
            delete(ReceiptRow).where(
                col(ReceiptRow.id) == claim_id, col(ReceiptRow.response) == IN_FLIGHT
            )
        )

    store._write(caller, [], op)


def run_once(
    store: StoreBase,
    caller: Caller,
    operation: str,
    idempotency: Idempotency | None,
    model: type[M],
    run: Callable[[], M],
) -> M:
    """Run ``run()`` at most once per idempotency key (see the module docstring).

    Args:
        store: the ledger holding the receipts.
        caller: the acting identity (its org and principal are part of the receipt's
            identity).
        operation: the operation name (``release``, ``release_by_id``, ``renew``,
            ``transfer``, ``force_release``, ``resolve``; at most 32 characters).
        idempotency: the validated key, the rest of the receipt's identity (``scope``: the
            resource of a lease presented by proof, the handoff id of a resolve, ``""`` for
            release/force release by id, the lease id then being part of the request
            digest) and the request as given (``fields``, digested with
            :func:`prefect_baton._rules.digests.operation_digest`); ``None`` to just call
            ``run()``.
        model: the result model (its JSON is the stored response).
        run: the operation.

    Returns:
        ``run()``'s result, or on an exact retry the stored one with ``replayed=True``.

    Raises:
        IdempotencyMismatchError: the key was used for a different request (nothing run,
            nothing written). IdempotencyInFlightError: a request under the key is still
            running (claimed less than :data:`CLAIM_TIMEOUT_SECONDS` ago). Whatever
            ``run()`` raises (then no receipt is kept). UnavailableError: the ledger.
    """
    if idempotency is None:
        return run()
    key, scope = idempotency.key, idempotency.scope
    digest = operation_digest(operation, idempotency.fields)
    claim_id, stored = _claim(store, caller, operation, key, scope, digest)
    if stored is not None:
        return model.model_validate({**stored, "replayed": True})
    assert claim_id is not None
    try:
        result = run()
    except BatonError:
        _drop(store, caller, claim_id)
        raise
    _complete(store, caller, claim_id, result.model_dump_json())
    return result


class KeepsReceipts(Protocol):
    """A lease authority whose idempotency receipts a ledger keeps (:func:`receipted`)."""

    @property
    def receipt_ledger(self) -> StoreBase:
        """The ledger holding the receipts (the ledger store itself, or Redis's ledger)."""
        ...


S = TypeVar("S", bound=KeepsReceipts)


def receipted(
    operation: str, model: type[M]
) -> Callable[[Callable[Concatenate[S, Caller, P], M]], Callable[Concatenate[S, Caller, P], M]]:
    """Make a method of a :class:`KeepsReceipts` authority run at most once per idempotency
    key: the decorated method takes ``(self, caller, ...)`` and the keyword
    ``idempotency: Idempotency | None = None`` of its protocol signature, which this
    decorator consumes (the method body runs without it) with :func:`run_once` in
    ``self.receipt_ledger``.

    Args:
        operation: the receipt's operation name (see :func:`run_once`).
        model: the method's result model (its JSON is the stored response).

    Returns:
        The decorator. The wrapped method raises what :func:`run_once` raises.
    """

    def decorate(
        method: Callable[Concatenate[S, Caller, P], M],
    ) -> Callable[Concatenate[S, Caller, P], M]:
        @functools.wraps(method)
        def wrapper(self: S, caller: Caller, /, *args: P.args, **kwargs: P.kwargs) -> M:
            idempotency = kwargs.pop("idempotency", None)
            if idempotency is None:  # the unkeyed call: no receipt, nothing else to do
                return method(self, caller, *args, **kwargs)
            return run_once(
                self.receipt_ledger,
                caller,
                operation,
                cast("Idempotency", idempotency),
                model,
                lambda: method(self, caller, *args, **kwargs),
            )

        return wrapper

    return decorate
