"""The REST API as the client's store: ``Baton(api_url=..., api_key=...)``.

:class:`RestStore` implements the lease authority protocol
(:class:`~prefect_baton._stores.protocol.LeaseAuthority`) and the record operations of the ledger
store (:class:`~prefect_baton._stores.protocol.RecordStore`) over HTTP with one pooled
:class:`httpx.Client`. Requests go to the routes of :mod:`prefect_baton.rest.app`; answers
come back as the same :mod:`prefect_baton.models` and failures as the same
:class:`~prefect_baton.errors.BatonError` subclasses with the same codes and fields (a lease
``CONFLICT`` carries ``expires_at``, ``VERSION_CONFLICT`` the current and expected versions).

Transport, parsing and the mapping of failures that are not an error envelope of the API
(:class:`UnavailableError`, ``UNAUTHENTICATED`` ...) are in :mod:`prefect_baton._stores.rest.http`.

The key decides the identity: the caller passed to each method is the one the key
authenticated as (:meth:`RestStore.identity`, ``GET /v1/me``), whatever it says. The
key is kept as a :class:`pydantic.SecretStr` and appears in no log, repr or message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr

from prefect_baton._rules.core import Proof, ReleaseRequest, RenewRequest, TransferRequest
from prefect_baton._rules.keeping import heartbeat_call_timeout
from prefect_baton._rules.paging import MAX_PAGE, ListName, encode_cursor
from prefect_baton._rules.validation import TTL_MIN_SECONDS
from prefect_baton._stores.protocol import (
    AcquireRequest,
    Caller,
    CheckpointWrite,
    Execution,
    Fence,
    HandoffOffer,
    Idempotency,
    OutcomeWrite,
    ResolveRequest,
)
from prefect_baton._stores.queries import (
    EventQuery,
    HandoffQuery,
    HistoryQuery,
    LeaseQuery,
    OutcomeQuery,
)
from prefect_baton._stores.rest.http import (
    _M,
    DEFAULT_TIMEOUT_SECONDS,
    _params,
    _seg,
    _Transport,
    _UnreadableAnswer,
)
from prefect_baton.errors import (
    ForbiddenError,
    NotFoundError,
    UnauthenticatedError,
    ValidationError,
)
from prefect_baton.models import Checkpoint, Event, Handoff, Lease, LeaseInfo, Outcome, Receipt

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "Identity", "RestStore", "UnauthenticatedError"]


def _key(idempotency: Idempotency | None) -> str | None:
    """The ``Idempotency-Key`` header of a call (the server keeps the receipt)."""
    return None if idempotency is None else idempotency.key


def _seconds(ms: int | None) -> int | None:
    """A duration of ``ms`` milliseconds as the API's whole seconds (``None`` stays
    ``None``): the client turned the caller's whole seconds into milliseconds."""
    return ms // 1000 if ms is not None else None


def _fence_fields(fence: Fence | None) -> dict[str, object]:
    """The body fields of a fenced write (``fence_lease_id`` and ``fence_epoch``, ``None``
    without a fence)."""
    return {
        "fence_lease_id": fence.lease_id if fence else None,
        "fence_epoch": fence.epoch if fence else None,
    }


class Identity(BaseModel):
    """Who an API key acts as (``GET /v1/me``).

    Attributes:
        org, principal, role: the identity (``str``). scopes: the key's scopes.
        key_id: the key's public id. state_max_bytes: the server's checkpoint state cap.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    org: str
    principal: str
    role: str
    scopes: tuple[str, ...] = ()
    key_id: str | None = None
    state_max_bytes: int = 1024 * 1024


def _acquire_body(request: AcquireRequest) -> dict[str, Any]:
    """The JSON body of one acquire (``POST /v1/leases``; an item of
    ``POST /v1/leases/batch``): the TTL in whole seconds, the scopes as a list."""
    return {
        "resource_type": request.resource_type,
        "resource_id": request.resource_id,
        "ttl_seconds": request.ttl_ms // 1000,
        "purpose": request.purpose,
        "scopes": list(request.scopes),
        "expected_version": request.expected_version,
    }


def _with_attempt(body: dict[str, Any], execution: Execution) -> dict[str, Any]:
    """``body`` with ``execution.attempt`` as its ``attempt`` when one is given."""
    return body if execution.attempt is None else {**body, "attempt": execution.attempt}


class RestStore(_Transport):
    """The REST API at ``api_url`` as lease authority and record store.

    Args:
        api_url: base URL of the API (``str``; e.g. ``http://127.0.0.1:8787``; the routes
            are under ``/v1``).
        api_key: a bearer key (``str`` or :class:`pydantic.SecretStr`, ``bk_...``).
        timeout_seconds: per-request connect/read/write timeout (``float`` seconds > 0).
        client: an :class:`httpx.Client` to share (its pool); the store then does not
            close it.

    Raises:
        ValidationError: a malformed URL or key, or a bad timeout.
    """

    _identity: Identity | None = None  # GET /v1/me, asked once by identity()

    def __repr__(self) -> str:
        return f"RestStore(api_url={self.url!r})"

    def with_key(self, api_key: str | SecretStr) -> RestStore:
        """Another store for ``api_key`` sharing this one's connection pool (closing it
        leaves the pool open)."""
        return RestStore(self.url, api_key, timeout_seconds=self.timeout_seconds, client=self._http)

    def identity(self) -> Identity:
        """Who the key acts as (``GET /v1/me``, asked once and kept).

        Raises:
            UnauthenticatedError: the key is unknown or revoked. UnavailableError: no
            answer. ValidationError: ``api_url`` does not serve this API (``GET /v1/me``
            is ``404``, a redirect, another status or not an identity).
        """
        if self._identity is None:
            try:
                data, _ = self._call("GET", "/v1/me")
                self._identity = self._parse(Identity, data)
            except NotFoundError:
                raise ValidationError(
                    f"{self.url} does not serve the prefect-baton REST API (GET /v1/me is 404)"
                ) from None
            except _UnreadableAnswer as exc:
                raise ValidationError(
                    f"{self.url} does not serve the prefect-baton REST API ({exc.message})"
                ) from None
        return self._identity

    def bound_caller(self) -> Caller:
        """The identity of the key (:meth:`identity`): every operation acts as it.

        Raises:
            As :meth:`identity`.
        """
        me = self.identity()
        return Caller(org=me.org, principal=me.principal, role=me.role)

    def fence(self, caller: Caller, lease: Lease) -> Fence:
        """The plain fence of ``lease`` (its id and epoch; the server judges it). Raises
        nothing."""
        return Fence(lease.lease_id, lease.epoch)

    def ledger_barrier(self, caller: Caller) -> None:
        """Nothing to wait for: the server orders its own ledger and authority."""

    def expire_handoffs(
        self, caller: Caller, *, handoff_id: str | None = None, limit: int = 1000
    ) -> list[Lease]:
        """Nothing to do here: the server ends expired handoffs on its own reads, resolves,
        acquires and sweeps (``report-expired``). Returns ``[]``."""
        return []

    @property
    def state_max_bytes(self) -> int:
        """The server's checkpoint state cap in bytes."""
        return self.identity().state_max_bytes

    def _lease(self, data: Any, replayed: bool = False) -> Lease:
        return self._parse(Lease, data, replayed=replayed)

    def _send(
        self, model: type[_M], method: str, path: str, key: str | None, body: Any = None
    ) -> _M:
        """``method path`` with the JSON ``body`` (none for ``None``) and the
        ``Idempotency-Key`` ``key`` when given: the answer as ``model``, marked replayed when
        the server replayed it."""
        data, replayed = self._call(method, path, json=body, idempotency_key=key)
        return self._parse(model, data, replayed=replayed)

    def _paged(
        self, name: ListName, path: str, params: dict[str, Any], limit: int, model: type[_M]
    ) -> list[_M]:
        """``GET path``: at most ``limit`` items of list ``name`` (the answer's field of that
        name). ``limit`` may be one more than the largest page the API serves (the client
        asks one item more than a page, :func:`~prefect_baton._rules.paging.store_limit`):
        that item is then the first of the next page, asked with the answer's
        ``next_cursor`` (in place of an ``after`` in ``params``); so are the items a server
        left out of a page it cut shorter than asked."""
        first = min(limit, MAX_PAGE[name])
        data, _ = self._call("GET", path, params={**params, "limit": first})
        items = self._list(model, data, name)
        cursor = data.get("next_cursor") if isinstance(data, dict) else None
        params = {k: v for k, v in params.items() if k != "after"}
        while len(items) < limit and isinstance(cursor, str):
            # past the largest page, or a page the server cut shorter (a checkpoint's
            # history: history_page_cap): the next items, by the answer's cursor
            rest = min(limit - len(items), MAX_PAGE[name])
            data, _ = self._call("GET", path, params={**params, "limit": rest, "cursor": cursor})
            more = self._list(model, data, name)
            if not more:
                break
            items += more
            cursor = data.get("next_cursor") if isinstance(data, dict) else None
        return items

    def _by_proof(
        self,
        action: str,
        proof: Proof,
        body: dict[str, Any],
        idempotency: Idempotency | None,
        timeout_seconds: float | None = None,
    ) -> tuple[Any, bool]:
        """``POST /v1/leases/{id}/<action>`` of the lease named by ``proof``: ``body`` plus
        the proof's execution key (and the ``Idempotency-Key`` header when a key is given),
        within ``timeout_seconds`` if given; returns the answer and whether it was
        replayed."""
        return self._call(
            "POST",
            f"/v1/leases/{_seg(proof.lease_id)}/{action}",
            json={**body, "execution_key": proof.execution_key},
            idempotency_key=_key(idempotency),
            timeout_seconds=timeout_seconds,
        )

    # ------------------------------------------------------------------ leases

    def acquire(self, caller: Caller, request: AcquireRequest, execution: Execution) -> Lease:
        """``POST /v1/leases`` (``execution.attempt`` in the body when given)."""
        body = _with_attempt(_acquire_body(request), execution)
        return self._send(Lease, "POST", "/v1/leases", execution.key, body)

    def acquire_many(
        self, caller: Caller, requests: Sequence[AcquireRequest], execution: Execution
    ) -> list[Lease]:
        """``POST /v1/leases/batch``: every request or none (``execution.attempt`` in the
        body when given)."""
        items = [_acquire_body(r) for r in requests]
        body = {
            "resources": items,
            "ttl_seconds": items[0]["ttl_seconds"] if items else TTL_MIN_SECONDS,
        }
        body = _with_attempt(body, execution)
        data, _ = self._call("POST", "/v1/leases/batch", json=body, idempotency_key=execution.key)
        leases = self._list(Lease, data, "leases")
        flags = data.get("replayed")
        if not isinstance(flags, list) or len(flags) != len(leases):
            flags = [False] * len(leases)
        pairs = zip(leases, flags, strict=True)
        return [lease.model_copy(update={"replayed": bool(f)}) for lease, f in pairs]

    def renew(
        self, caller: Caller, request: RenewRequest, *, idempotency: Idempotency | None = None
    ) -> Lease:
        """``POST /v1/leases/{id}/renew`` with the proof's execution key (and the
        ``Idempotency-Key`` header when a key is given), within
        :func:`~prefect_baton._rules.keeping.heartbeat_call_timeout` of the TTL (below the
        keeper's renew deadline) or the client's timeout if shorter."""
        ttl_ms = request.ttl_ms
        body = {"ttl_seconds": ttl_ms // 1000, "expected_version": request.expected_version}
        limit = heartbeat_call_timeout(ttl_ms / 1000)
        return self._lease(*self._by_proof("renew", request.proof, body, idempotency, limit))

    def transfer(
        self, caller: Caller, request: TransferRequest, *, idempotency: Idempotency | None = None
    ) -> Lease:
        """``POST /v1/leases/{id}/transfer`` with the proof's execution key (and the
        ``Idempotency-Key`` header when a key is given)."""
        body = {
            "to_principal": request.to_principal,
            "new_execution_key": request.new_execution_key,
            "ttl_seconds": request.ttl_ms // 1000,
            "expected_version": request.expected_version,
        }
        return self._lease(*self._by_proof("transfer", request.proof, body, idempotency))

    def release(
        self, caller: Caller, request: ReleaseRequest, *, idempotency: Idempotency | None = None
    ) -> Receipt:
        """``POST /v1/leases/{id}/release`` (by proof; ``Idempotency-Key`` when given)."""
        body = {"expected_version": request.expected_version}
        data, replayed = self._by_proof("release", request.proof, body, idempotency)
        return self._parse(Receipt, data, replayed=replayed)

    def release_by_id(
        self, caller: Caller, lease_id: str, *, idempotency: Idempotency | None = None
    ) -> Receipt:
        """``DELETE /v1/leases/{id}`` (``Idempotency-Key`` when given)."""
        data, replayed = self._call(
            "DELETE", f"/v1/leases/{_seg(lease_id)}", idempotency_key=_key(idempotency)
        )
        receipt = {"action": "release_by_id", "replayed": replayed}
        if isinstance(data, dict):
            receipt |= {"status": data.get("status"), "lease": data.get("lease")}
        return self._parse(Receipt, receipt)

    def force_release(
        self, caller: Caller, lease_id: str, *, idempotency: Idempotency | None = None
    ) -> Receipt:
        """``POST /v1/leases/{id}/force-release`` (``Idempotency-Key`` when given)."""
        path = f"/v1/leases/{_seg(lease_id)}/force-release"
        return self._send(Receipt, "POST", path, _key(idempotency))

    def inspect(self, caller: Caller, resource_type: str, resource_id: str) -> LeaseInfo:
        """``GET /v1/leases/inspect``."""
        data, _ = self._call(
            "GET",
            "/v1/leases/inspect",
            params={"resource_type": resource_type, "resource_id": resource_id},
        )
        return self._parse(LeaseInfo, data)

    def get(self, caller: Caller, lease_id: str) -> Lease:
        """``GET /v1/leases/{id}``."""
        data, _ = self._call("GET", f"/v1/leases/{_seg(lease_id)}")
        return self._lease(data)

    def list_leases(self, caller: Caller, query: LeaseQuery) -> list[Lease]:
        """``GET /v1/leases``."""
        params = _params(
            resource_type=query.resource_type,
            owner=query.owner,
            include_ended="true" if query.include_ended else None,
            cursor=None if query.after is None else encode_cursor("leases", query.after),
        )
        return self._paged("leases", "/v1/leases", params, query.limit, Lease)

    def report_expired(self, caller: Caller, *, limit: int = 1000) -> list[Lease]:
        """``POST /v1/leases/report-expired``."""
        data, _ = self._call("POST", "/v1/leases/report-expired", params={"limit": limit})
        return self._list(Lease, data, "leases")

    def prune_receipts(self, caller: Caller) -> int:
        """Not offered over REST (it deletes receipts of every org of the ledger).

        Raises:
            ForbiddenError: always; run it where the ledger is (a local client).
        """
        raise ForbiddenError(
            "prune_receipts is not available over the REST API; run it with a client that "
            "has the ledger URL"
        )

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_save(
        self, caller: Caller, write: CheckpointWrite, *, idempotency_key: str | None
    ) -> Checkpoint:
        """``PUT /v1/checkpoints`` (the fence as ``fence_lease_id`` + ``fence_epoch``)."""
        body = {
            "subject_id": write.subject_id,
            "kind": write.kind,
            "state": write.state,
            "expected_version": write.expected_version,
            **_fence_fields(write.fence),
            "ttl_seconds": _seconds(write.ttl_ms),
        }
        return self._send(Checkpoint, "PUT", "/v1/checkpoints", idempotency_key, body)

    def checkpoint_get(
        self, caller: Caller, subject_id: str, kind: str, principal: str | None = None
    ) -> Checkpoint | None:
        """``GET /v1/checkpoints``; ``None`` on ``404``."""
        params = _params(subject_id=subject_id, kind=kind, principal=principal)
        try:
            data, _ = self._call("GET", "/v1/checkpoints", params=params)
        except NotFoundError:
            return None
        return self._parse(Checkpoint, data)

    def checkpoint_delete(
        self, caller: Caller, checkpoint_id: str, *, idempotency_key: str | None
    ) -> Checkpoint:
        """``DELETE /v1/checkpoints/{id}`` (``Idempotency-Key`` when given)."""
        path = f"/v1/checkpoints/{_seg(checkpoint_id)}"
        return self._send(Checkpoint, "DELETE", path, idempotency_key)

    def checkpoint_get_by_id(self, caller: Caller, checkpoint_id: str) -> Checkpoint:
        """``GET /v1/checkpoints/{id}``."""
        data, _ = self._call("GET", f"/v1/checkpoints/{_seg(checkpoint_id)}")
        return self._parse(Checkpoint, data)

    def checkpoint_history(self, caller: Caller, query: HistoryQuery) -> list[Checkpoint]:
        """``GET /v1/checkpoints/history`` (``query.after`` sent as the page's ``cursor``)."""
        params = _params(
            subject_id=query.subject_id,
            kind=query.kind,
            principal=query.principal,
            cursor=None if query.after is None else encode_cursor("checkpoints", query.after),
        )
        path = "/v1/checkpoints/history"
        return self._paged("checkpoints", path, params, query.limit, Checkpoint)

    # ------------------------------------------------------------------ handoffs

    def handoff_create(
        self, caller: Caller, offer: HandoffOffer, *, idempotency_key: str | None
    ) -> Handoff:
        """``POST /v1/handoffs``."""
        lease = offer.lease
        body: dict[str, Any] = {
            "to_principal": offer.to_principal,
            "subject_id": offer.subject_id,
            "checkpoint_id": offer.checkpoint_id,
            "context_id": offer.context_id,
            "message": offer.message,
            "lease_id": lease.lease_id if lease else None,
            "expires_in_seconds": _seconds(offer.expires_in_ms),
        }
        if offer.parameters is not None:
            body["parameters"] = offer.parameters
        if lease is not None:
            body["lease_execution_key"] = lease.execution_key
        return self._send(Handoff, "POST", "/v1/handoffs", idempotency_key, body)

    def handoff_inbox(
        self, caller: Caller, *, limit: int = 100, after: tuple[int, str] | None = None
    ) -> list[Handoff]:
        """``GET /v1/handoffs`` (``after`` sent as the page's ``cursor``)."""
        cursor = None if after is None else encode_cursor("handoffs", after)
        return self._paged("handoffs", "/v1/handoffs", _params(cursor=cursor), limit, Handoff)

    def handoff_list(self, caller: Caller, query: HandoffQuery) -> list[Handoff]:
        """``GET /v1/handoffs?party=...`` (the caller's own name when ``query.party`` is
        ``None``; ``status=any`` for ``query.status`` ``None``)."""
        params = _params(
            party=caller.principal if query.party is None else query.party,
            status="any" if query.status is None else query.status,
            cursor=None if query.after is None else encode_cursor("handoffs", query.after),
        )
        return self._paged("handoffs", "/v1/handoffs", params, query.limit, Handoff)

    def handoff_get(self, caller: Caller, handoff_id: str) -> Handoff:
        """``GET /v1/handoffs/{id}``."""
        data, _ = self._call("GET", f"/v1/handoffs/{_seg(handoff_id)}")
        return self._parse(Handoff, data)

    def handoff_resolve(
        self, caller: Caller, request: ResolveRequest, *, idempotency: Idempotency | None = None
    ) -> Handoff:
        """``POST /v1/handoffs/{id}/resolve`` (``Idempotency-Key`` when given)."""
        body = {
            "status": request.status,
            "note": request.note,
            "execution_key": request.execution_key,
            "ttl_seconds": _seconds(request.ttl_ms),
        }
        path = f"/v1/handoffs/{_seg(request.handoff_id)}/resolve"
        return self._send(Handoff, "POST", path, _key(idempotency), body)

    # ------------------------------------------------------------------ outcomes, events

    def outcome_record(
        self, caller: Caller, record: OutcomeWrite, *, idempotency_key: str | None
    ) -> Outcome:
        """``POST /v1/outcomes``."""
        body = {
            "subject_id": record.subject_id,
            "status": record.status,
            "evidence": [e.model_dump() for e in record.evidence],
            **_fence_fields(record.fence),
            "lease_id": record.lease_id,
            "handoff_id": record.handoff_id,
            "checkpoint_id": record.checkpoint_id,
        }
        return self._send(Outcome, "POST", "/v1/outcomes", idempotency_key, body)

    def outcome_list(self, caller: Caller, query: OutcomeQuery) -> list[Outcome]:
        """``GET /v1/outcomes`` (``query.after`` sent as the page's ``cursor``)."""
        cursor = None if query.after is None else encode_cursor("outcomes", query.after)
        params = _params(subject_id=query.subject_id, cursor=cursor)
        return self._paged("outcomes", "/v1/outcomes", params, query.limit, Outcome)

    def events_list(self, caller: Caller, query: EventQuery) -> list[Event]:
        """``GET /v1/events``."""
        rtype, rid = query.resource or (None, None)
        params = _params(
            after=query.after_seq,
            kind=query.kind,
            resource_type=rtype,
            resource_id=rid,
            subject=query.subject,
        )
        return self._paged("events", "/v1/events", params, query.limit, Event)
