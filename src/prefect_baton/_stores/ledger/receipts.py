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

A claim is a ``baton_receipts`` row whose ``response`` is :data:`CLAIM_PREFIX` followed by
the claim's token (a complete receipt holds JSON, which starts with ``{``; a claim written
by an earlier version holds the empty string) and whose ``expires_at_ms`` is the claim
expiry. A token names the process that claimed (:func:`claim_token`), and each process
knows which of its claims are still running. So when the reply to a claim's ``COMMIT`` is
lost (the caller got ``UNAVAILABLE`` and never ran the operation) or the reply to deleting
it is, the retry from the same process learns at once that the claim is its own and no
longer running, takes it over and runs the operation.

Crash window: a process that dies after claiming but before step 3 leaves a claim that
other processes cannot tell from a running one; it lapses after
:data:`CLAIM_TIMEOUT_SECONDS`. A retry that takes over a lapsed claim (or its own abandoned
one, as when storing the response failed after the operation was applied) first asks the
operation's ``recover`` (if it has one) whether the request's effect is already recorded:
a handoff resolve finds the handoff resolved as the request asks
(:func:`prefect_baton._rules.handoffs.resolution_recorded`) and answers it as replayed.
Otherwise the retry runs the operation again and gets that operation's own answer (a
second release by proof is ``no_change``, a renew extends again, a transfer is
``LEASE_LOST``).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

from pydantic import BaseModel
from sqlalchemy import delete, select, update
from sqlmodel import col

from prefect_baton._ids import random_uuid4_hex
from prefect_baton._rules.digests import mismatch, operation_digest
from prefect_baton._stores.ledger.tables import ReceiptRow
from prefect_baton._stores.protocol import Caller, Idempotency
from prefect_baton.errors import BatonError, IdempotencyInFlightError

if TYPE_CHECKING:
    from prefect_baton._stores.ledger.base import StoreBase, Tx

M = TypeVar("M", bound=BaseModel)
P = ParamSpec("P")

#: How long a claim (an operation started under a key and not yet answered) blocks a
#: concurrent duplicate with ``IDEMPOTENCY_IN_FLIGHT``, in seconds; after that a retry may
#: take the claim over and run the operation again.
CLAIM_TIMEOUT_SECONDS = 60

#: The ``response`` of a claim row is this prefix and the claim's token.
CLAIM_PREFIX = "claim:"

_process = ""  # this process's part of the claim tokens (a forked child draws its own)
_running: set[str] = set()  # tokens of this process's claims whose operation still runs
_running_lock = threading.Lock()


def _new_process() -> None:
    global _process
    _process = uuid.uuid4().hex
    with _running_lock:
        _running.clear()


_new_process()
os.register_at_fork(after_in_child=_new_process)


def claim_token() -> str:
    """A new claim token: this process's id, a dot, and a random part (``str``)."""
    return f"{_process}.{random_uuid4_hex()}"


def _orphaned(response: str) -> bool:
    """Whether the claim whose ``response`` is given was made by this process and its
    operation no longer runs (its caller gave up: a lost reply, or an error)."""
    token = response.removeprefix(CLAIM_PREFIX)
    if not response.startswith(CLAIM_PREFIX) or token.partition(".")[0] != _process:
        return False
    with _running_lock:
        return token not in _running


def _is_claim(response: str) -> bool:
    return not response.startswith("{")


def _identity(caller: Caller, operation: str, key: str, scope: str) -> dict[str, Any]:
    """The columns of ``baton_receipts`` that identify a receipt, with their values."""
    return {
        "org_id": caller.org,
        "principal": caller.principal,
        "operation": operation,
        "idem_key": key,
        "scope_key": scope,
    }


#: ``baton_receipts``'s identity of a receipt, as ``?`` placeholders in :func:`receipt_key`'s
#: order (the statements below run with :meth:`StoreBase._sql`: no ORM on a keyed write).
_WHERE_KEY = "org_id = ? AND principal = ? AND operation = ? AND idem_key = ? AND scope_key = ?"
RECEIPT_SELECT = (
    "SELECT id, expires_at_ms, request_digest, response FROM baton_receipts WHERE " + _WHERE_KEY
)
RECEIPT_DELETE = "DELETE FROM baton_receipts WHERE " + _WHERE_KEY
#: parameters: :func:`receipt_key`, then request digest, response, created and expiry (ms).
RECEIPT_INSERT = (
    "INSERT INTO baton_receipts (org_id, principal, operation, idem_key, scope_key, "
    "request_digest, response, created_at_ms, expires_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def receipt_key(caller: Caller, operation: str, key: str, scope: str) -> tuple[str, ...]:
    """The parameters of the receipt identity in :data:`RECEIPT_SELECT` and
    :data:`RECEIPT_DELETE`: ``(org, principal, operation, key, scope)``."""
    return (caller.org, caller.principal, operation, key, scope)


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
    :data:`CLAIM_PREFIX` and the claim's token) or a complete receipt (``response``: the
    stored JSON), created at ``now_ms`` and expiring at ``expires_at_ms`` (epoch
    milliseconds)."""
    return ReceiptRow(
        **_identity(caller, operation, key, scope),
        request_digest=digest,
        response=response,
        created_at_ms=now_ms,
        expires_at_ms=expires_at_ms,
    )


#: What step 1 found: ``(claim row id, None, resumed)`` to run the operation under the
#: claim (``resumed``: it took over an earlier claim of the same request, lapsed or
#: abandoned, whose operation may have been applied), or ``(None, response, False)`` for an
#: exact retry of a completed one.
Claimed = tuple[int, None, bool] | tuple[None, dict[str, Any], bool]


def _claim(
    store: StoreBase,
    caller: Caller,
    operation: str,
    key: str,
    scope: str,
    digest: str,
    token: str,
) -> Claimed:
    """Step 1 (see :data:`Claimed`)."""

    def op(tx: Tx) -> Claimed:
        row = tx.session.execute(
            select(ReceiptRow).where(*receipt_identity(caller, operation, key, scope))
        ).scalar_one_or_none()
        lapsed = False
        if row is not None and row.expires_at_ms <= tx.now_ms:
            # an expired receipt or a lapsed claim (of the same request: same digest)
            lapsed = _is_claim(row.response) and row.request_digest == digest
            tx.session.delete(row)
            tx.session.flush()
            row = None
        if row is not None:
            if row.request_digest != digest:
                raise mismatch(operation, key)
            if _is_claim(row.response) and _orphaned(row.response):
                row.response = CLAIM_PREFIX + token  # this process's own, abandoned: take it
                row.expires_at_ms = tx.now_ms + CLAIM_TIMEOUT_SECONDS * 1000
                tx.session.add(row)
                tx.session.flush()
                assert row.id is not None
                return row.id, None, True
            if _is_claim(row.response):
                raise IdempotencyInFlightError(
                    f"a {operation} request with idempotency key {key!r} is still in flight; "
                    f"retry later (a claim lapses after {CLAIM_TIMEOUT_SECONDS} s)"
                )
            stored: dict[str, Any] = json.loads(row.response)
            return None, stored, False
        claim = receipt_row(
            caller,
            operation,
            key,
            scope,
            digest,
            response=CLAIM_PREFIX + token,
            now_ms=tx.now_ms,
            expires_at_ms=tx.now_ms + CLAIM_TIMEOUT_SECONDS * 1000,
        )
        tx.session.add(claim)
        tx.session.flush()
        assert claim.id is not None
        return claim.id, None, lapsed

    lock = f"receipt:{caller.org}:{caller.principal}:{operation}:{key}:{scope}"
    return store._write(caller, [lock], op)


def _complete(store: StoreBase, caller: Caller, claim_id: int, token: str, response: str) -> None:
    """Step 3: turn claim ``token`` into the receipt (a claim taken over meanwhile is
    left)."""

    def op(tx: Tx) -> None:
        tx.session.execute(
            update(ReceiptRow)
            .where(col(ReceiptRow.id) == claim_id, col(ReceiptRow.response) == CLAIM_PREFIX + token)
            .values(response=response, expires_at_ms=tx.now_ms + store.receipt_retention_ms)
        )

    store._write(caller, [], op)


def _drop(store: StoreBase, caller: Caller, claim_id: int, token: str) -> None:
    """Delete claim ``token`` of an operation that failed: nothing is stored."""

    def op(tx: Tx) -> None:
        tx.session.execute(
            delete(ReceiptRow).where(
                col(ReceiptRow.id) == claim_id, col(ReceiptRow.response) == CLAIM_PREFIX + token
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
    recover: Callable[[], M | None] | None = None,
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
        recover: for a retry that took over an earlier claim of the same request (lapsed,
            or abandoned by this process), whose operation may have been applied before
            its response was stored: the result that request recorded, if its effect is
            found in place, else ``None`` (then ``run()`` runs). ``None``: no recovery.

    Returns:
        ``run()``'s result, or on an exact retry the stored one with ``replayed=True``
        (also the one ``recover`` found, which is then stored as the receipt).

    Raises:
        IdempotencyMismatchError: the key was used for a different request (nothing run,
            nothing written). IdempotencyInFlightError: a request under the key is still
            running (claimed less than :data:`CLAIM_TIMEOUT_SECONDS` ago by another process,
            or by this one and not yet answered). Whatever
            ``run()`` raises (then no receipt is kept). UnavailableError: the ledger.
    """
    if idempotency is None:
        return run()
    key, scope = idempotency.key, idempotency.scope
    digest = operation_digest(operation, idempotency.fields)
    token = claim_token()
    with _running_lock:
        _running.add(token)
    try:
        claim_id, stored, resumed = _claim(store, caller, operation, key, scope, digest, token)
        if stored is not None:
            return model.model_validate({**stored, "replayed": True})
        assert claim_id is not None
        try:
            found = recover() if resumed and recover is not None else None
            if found is not None:
                found = found.model_copy(update={"replayed": True})
                _complete(store, caller, claim_id, token, found.model_dump_json())
                return found
            result = run()
        except BatonError:
            _drop(store, caller, claim_id, token)
            raise
        _complete(store, caller, claim_id, token, result.model_dump_json())
        return result
    finally:
        with _running_lock:
            _running.discard(token)


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
