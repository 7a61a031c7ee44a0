"""Request plumbing shared by the route modules of :mod:`prefect_baton.rest.app`: the
:class:`~prefect_baton.Baton` of the request's caller (``B``), the ``Idempotency-Key``
header (``IdemKey``, ``NoKey``), the lease a proof or fence presents, and the success
envelope of a reply."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Header, Request
from pydantic import BaseModel
from starlette.responses import JSONResponse

from prefect_baton._client.leases import fence_by_id, proof_by_id
from prefect_baton._client.sync import Baton
from prefect_baton._rules.validation import validate_id
from prefect_baton._stores.protocol import Caller
from prefect_baton.errors import ValidationError
from prefect_baton.models import Lease
from prefect_baton.rest import _schemas as s
from prefect_baton.rest._http import ok

IdemKey = Annotated[str | None, Header(alias="Idempotency-Key")]


def _strip(value: Any) -> Any:
    """``value`` without the ``replayed`` flags of models (``meta.replayed`` carries it)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "replayed"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _utf8(key: str | None) -> str | None:
    """The ``Idempotency-Key`` header as sent: its bytes read as UTF-8 (Starlette hands
    header values over as Latin-1), so keys outside ASCII work as in Python, checked as an
    id (:func:`~prefect_baton._rules.validation.validate_id`) under the header's name.

    Raises:
        ValidationError: the bytes are not UTF-8 (read as Latin-1 instead, two different
            keys could become one); the key is empty, over 256 characters or holds a
            control or format character (``Idempotency-Key must not contain control
            characters``).
    """
    if key is None:
        return None
    try:
        text = key.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise ValidationError("Idempotency-Key must be UTF-8 text") from None
    return validate_id("Idempotency-Key", text)


def _no_idempotency_key(key: IdemKey = None) -> None:
    """Refuse ``Idempotency-Key`` on routes whose operation keeps no receipt (yet)."""
    if key is not None:
        raise ValidationError("Idempotency-Key is not supported on this route")


NoKey = [Depends(_no_idempotency_key)]

#: The execution key of a lease proof: an id (1 to 256 characters, no control characters),
#: as every execution key the Python API accepts; a malformed one is 400, not LEASE_LOST.
ExecutionKey = s.Id
#: A fencing token presented with ``fence_lease_id``: 0 to 2**53 - 1, as a version is (and
#: as the MCP tools' ``epoch``); out of range is 400, not STALE_FENCE.
Epoch = s.Version


def _proof_lease(b: Baton, lease_id: str, body: BaseModel, field: str = "execution_key") -> Lease:
    """The caller's lease ``lease_id`` with the execution key of the presented proof (the
    body's ``field``: ``execution_key``, or ``lease_execution_key`` of a handoff; absent:
    the lease's own), by :func:`~prefect_baton._client.leases.proof_by_id` as the CLI
    builds it.

    Raises:
        NotFoundError: the lease is unknown to the caller (404).
    """
    return proof_by_id(
        b.leases, lease_id, getattr(body, field, None), key_given=field in body.model_fields_set
    )


def _fence(b: Baton, lease_id: str | None, epoch: int | None) -> Lease | None:
    """The lease presented as a fence: the caller's lease ``lease_id`` at ``epoch``
    (:func:`~prefect_baton._client.leases.fence_by_id`, as the CLI and MCP tools).

    Raises:
        StaleFenceError: the lease is unknown to the caller (as the Python API refuses such
            a fence); one the caller can read is judged by the write itself.
    """
    return None if lease_id is None else fence_by_id(b.leases, lease_id, epoch)


def _dump(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return _strip(obj.model_dump(mode="json"))
    if isinstance(obj, list):
        return [_dump(o) for o in obj]
    return obj


def _rid(request: Request) -> str:
    return str(request.state.request_id)


def _reply(request: Request, obj: Any, *, status: int = 200, key: str = "") -> JSONResponse:
    data = {key: _dump(obj)} if key else _dump(obj)
    return ok(data, _rid(request), replayed=bool(getattr(obj, "replayed", False)), status=status)


#: Clients kept per app (one per identity that sent a request), cleared when full.
MAX_CACHED_CLIENTS = 4096


async def _baton(request: Request) -> Baton:
    """The :class:`Baton` of the request's caller (the bearer key's identity) over the
    app's stores. A client holds no state of its own, so one is kept per identity in
    ``app.state.batons``; ``async`` so that FastAPI runs it on the event loop, not on a
    worker thread (it does no I/O)."""
    caller: Caller = request.state.caller
    state = request.app.state
    batons: dict[Caller, Baton] = state.batons
    b = batons.get(caller)
    if b is None:
        if len(batons) >= MAX_CACHED_CLIENTS:
            batons.clear()
        b = batons[caller] = Baton(
            org=caller.org,
            principal=caller.principal,
            role=caller.role,
            settings=state.settings,
            store=state.store,
            lease_authority=state.authority,
        )
    return b


B = Annotated[Baton, Depends(_baton)]


#: The ``limit`` query parameter of a listing (:data:`~prefect_baton.rest._schemas.QueryInt`;
#: the client's ``_limit`` decides its range: ``limit must be an integer from 1 to N``).
Limit = s.QueryInt
