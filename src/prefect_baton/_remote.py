"""The REST API as the client's backend: ``Baton(api_url=..., api_key=...)``.

:class:`RemoteBackend` implements the lease authority protocol
(:class:`~prefect_baton._authority.LeaseAuthority`) and the record operations of the ledger
store (:class:`~prefect_baton._api_base.RecordStore`) over HTTP with one pooled
:class:`httpx.Client`. Requests go to the routes of :mod:`prefect_baton.rest.app`; answers
come back as the same :mod:`prefect_baton.models` and failures as the same
:class:`~prefect_baton.errors.BatonError` subclasses with the same codes and fields (a lease
``CONFLICT`` carries ``expires_at``, ``VERSION_CONFLICT`` the current and expected versions).

Mapping of what is not an error envelope of the API:

* no connection, a timeout or another transport failure: :class:`UnavailableError`;
* ``401``: :class:`UnauthenticatedError` (code ``UNAUTHENTICATED``); ``403``:
  :class:`ForbiddenError`; ``413``: :class:`ValidationError`; ``502``/``503``/``504`` or any
  other ``5xx`` without an envelope: :class:`UnavailableError`;
* an answer this client cannot read (a body that does not match the model, an error with an
  unknown code or malformed fields, another status, a redirect, which is never followed):
  :class:`UnavailableError` for an operation; for ``GET /v1/me`` (when the client is made)
  :class:`ValidationError`, "does not serve the prefect-baton REST API".

The key decides the identity: the caller passed to each method is the one the key
authenticated as (:meth:`RemoteBackend.identity`, ``GET /v1/me``), whatever it says. The
key is kept as a :class:`pydantic.SecretStr` and appears in no log, repr or message.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, SecretStr
from pydantic import ValidationError as PydanticValidationError

from ._authority import Caller
from ._core import Proof
from ._ledger.base import Fence
from ._redis.authority import AcquireRequest
from .errors import (
    BatonError,
    ForbiddenError,
    NotFoundError,
    UnauthenticatedError,
    UnavailableError,
    ValidationError,
    error_for_code,
)
from .models import Checkpoint, Event, Evidence, Handoff, Lease, LeaseInfo, Outcome, Receipt

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "Identity", "RemoteBackend", "UnauthenticatedError"]

#: Seconds a request may take (connect, each read and write) before it is ``UNAVAILABLE``.
DEFAULT_TIMEOUT_SECONDS = 30.0

_KEY_CHARS = frozenset(string.ascii_letters + string.digits + string.punctuation)

_M = TypeVar("_M", bound=BaseModel)


class _UnreadableAnswer(UnavailableError):
    """An answer that is not this REST API's (wrong shape, unknown status or code, a
    redirect): ``UNAVAILABLE`` for an operation, ``VALIDATION_ERROR`` for ``GET /v1/me``."""


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


def _base_url(api_url: object) -> str:
    if not isinstance(api_url, str) or not api_url.strip():
        raise ValidationError("api_url must be a non-empty http(s) URL")
    try:
        url = httpx.URL(api_url.strip())
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise ValidationError(f"bad api_url: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValidationError("api_url must be an http:// or https:// URL with a host")
    if url.query or url.fragment:
        raise ValidationError("api_url must not have a query or a fragment")
    return str(url).rstrip("/")


def _secret(api_key: object) -> SecretStr:
    raw = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
    if not isinstance(raw, str) or not raw:
        raise ValidationError("api_key must be a non-empty string")
    if len(raw) > 512 or not set(raw) <= _KEY_CHARS:
        # never echo the key: only say what is wrong with it
        raise ValidationError("api_key must be at most 512 printable ASCII characters")
    return SecretStr(raw)


def _seg(value: str) -> str:
    return quote(value, safe="")


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _error(status: int, body: Any) -> BatonError:
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and isinstance(err.get("code"), str):
        code = str(err["code"])
        message = str(err.get("message", ""))
        fields = {k: v for k, v in err.items() if k not in ("code", "message")}
        if code == "UNAUTHENTICATED":
            return UnauthenticatedError(message)
        if code == "PAYLOAD_TOO_LARGE":
            return ValidationError(message)
        try:
            built = error_for_code(code, message, **fields)
        except (TypeError, ValueError):
            return _UnreadableAnswer(f"the REST API sent a malformed {code} error: {message}")
        if type(built) is not BatonError:
            return built
    else:
        message = f"HTTP {status} without an error body"
    if status == 401:
        return UnauthenticatedError(message)
    if status == 403:
        return ForbiddenError(message)
    if status == 404:
        return NotFoundError(message)
    if status in (400, 413, 422):
        return ValidationError(message)
    if status >= 500:
        return UnavailableError(f"the REST API failed (HTTP {status}): {message}")
    return _UnreadableAnswer(f"unexpected HTTP {status} from the REST API: {message}")


class RemoteBackend:
    """The REST API at ``api_url`` as lease authority and record store.

    Args:
        api_url: base URL of the API (``str``; e.g. ``http://127.0.0.1:8787``; the routes
            are under ``/v1``).
        api_key: a bearer key (``str`` or :class:`pydantic.SecretStr`, ``bk_...``).
        timeout_seconds: per-request connect/read/write timeout (``float`` seconds > 0).
        client: an :class:`httpx.Client` to share (its pool); the backend then does not
            close it.

    Raises:
        ValidationError: a malformed URL or key, or a bad timeout.
    """

    _baton_remote = True

    def __init__(
        self,
        api_url: str,
        api_key: str | SecretStr,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = _base_url(api_url)
        self._key = _secret(api_key)
        if (
            isinstance(timeout_seconds, bool)
            or not isinstance(timeout_seconds, int | float)
            or not 0 < timeout_seconds <= 3600
        ):
            raise ValidationError("timeout_seconds must be a number of seconds in (0, 3600]")
        self.timeout_seconds = float(timeout_seconds)
        self._owns_client = client is None
        self._http = client or httpx.Client(
            base_url=self.url,
            timeout=httpx.Timeout(self.timeout_seconds),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            follow_redirects=False,
        )
        self._identity: Identity | None = None

    def __repr__(self) -> str:
        return f"RemoteBackend(api_url={self.url!r})"

    def with_key(self, api_key: str | SecretStr) -> RemoteBackend:
        """Another backend for ``api_key`` sharing this one's connection pool (closing it
        leaves the pool open)."""
        return RemoteBackend(
            self.url, api_key, timeout_seconds=self.timeout_seconds, client=self._http
        )

    def close(self) -> None:
        """Close the connection pool (when this backend created it)."""
        if self._owns_client:
            self._http.close()

    # ------------------------------------------------------------------ plumbing

    def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[Any, bool]:
        headers = {b"Authorization": f"Bearer {self._key.get_secret_value()}".encode("ascii")}
        if idempotency_key is not None:  # sent as UTF-8 bytes; the app reads them so
            headers[b"Idempotency-Key"] = idempotency_key.encode("utf-8")
        try:
            resp = self._http.request(method, path, json=json, params=params, headers=headers)
        except httpx.TimeoutException:
            raise UnavailableError(
                f"the REST API at {self.url} did not answer within {self.timeout_seconds} s"
            ) from None
        except httpx.TransportError as exc:
            raise UnavailableError(
                f"the REST API at {self.url} cannot be reached ({type(exc).__name__}: {exc})"
            ) from None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.is_success and isinstance(body, dict) and "data" in body:
            meta = body.get("meta")
            replayed = bool(meta.get("replayed", False)) if isinstance(meta, dict) else False
            return body["data"], replayed
        if resp.is_success:
            raise _UnreadableAnswer(f"the REST API at {self.url} sent no data envelope")
        if resp.is_redirect:  # never followed: the key would go wherever Location says
            raise _UnreadableAnswer(
                f"{self.url} redirects {method} {path} (HTTP {resp.status_code}); set api_url "
                "to the URL the API is served at"
            )
        raise _error(resp.status_code, body)

    def _parse(self, model: type[_M], value: Any, **extra: Any) -> _M:
        """``value`` (plus ``extra`` fields) as ``model``; an answer of another shape is
        :class:`UnavailableError`."""
        try:
            return model.model_validate({**value, **extra} if extra else value)
        except (PydanticValidationError, TypeError, ValueError):
            raise _UnreadableAnswer(
                f"the REST API at {self.url} sent an answer that is not a valid {model.__name__}"
            ) from None

    def _list(self, model: type[_M], data: Any, field: str) -> list[_M]:
        """The list ``data[field]`` of ``model`` items (:class:`UnavailableError` if not)."""
        items = data.get(field) if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise _UnreadableAnswer(
                f"the REST API at {self.url} sent an answer without a list of {field}"
            )
        return [self._parse(model, x) for x in items]

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

    @property
    def state_max_bytes(self) -> int:
        """The server's checkpoint state cap in bytes."""
        return self.identity().state_max_bytes

    def _lease(self, data: Any, replayed: bool = False) -> Lease:
        return self._parse(Lease, data, replayed=replayed)

    # ------------------------------------------------------------------ leases

    def acquire(
        self,
        caller: Caller,
        resource_type: str,
        resource_id: str,
        *,
        ttl_ms: int,
        scopes: tuple[str, ...],
        purpose: str | None,
        expected_version: int | None,
        idempotency_key: str | None,
    ) -> Lease:
        """``POST /v1/leases``."""
        body = {
            "resource_type": resource_type,
            "resource_id": resource_id,
            "ttl_seconds": ttl_ms // 1000,
            "purpose": purpose,
            "scopes": list(scopes),
            "expected_version": expected_version,
        }
        data, replayed = self._call(
            "POST", "/v1/leases", json=body, idempotency_key=idempotency_key
        )
        return self._lease(data, replayed)

    def acquire_many(
        self,
        caller: Caller,
        requests: Sequence[AcquireRequest],
        *,
        idempotency_key: str | None,
    ) -> list[Lease]:
        """``POST /v1/leases/batch``: every request or none."""
        items = [
            {
                "resource_type": r.resource_type,
                "resource_id": r.resource_id,
                "ttl_seconds": r.ttl_ms // 1000,
                "purpose": r.purpose,
                "scopes": list(r.scopes),
                "expected_version": r.expected_version,
            }
            for r in requests
        ]
        body = {"resources": items, "ttl_seconds": items[0]["ttl_seconds"] if items else 10}
        data, _ = self._call("POST", "/v1/leases/batch", json=body, idempotency_key=idempotency_key)
        leases = self._list(Lease, data, "leases")
        flags = data.get("replayed")
        if not isinstance(flags, list) or len(flags) != len(leases):
            flags = [False] * len(leases)
        pairs = zip(leases, flags, strict=True)
        return [lease.model_copy(update={"replayed": bool(f)}) for lease, f in pairs]

    def renew(
        self,
        caller: Caller,
        proof: Proof,
        *,
        ttl_ms: int,
        expected_version: int | None,
        idempotency_key: str | None = None,
    ) -> Lease:
        """``POST /v1/leases/{id}/renew`` with the proof's execution key (and the
        ``Idempotency-Key`` header when a key is given)."""
        body = {
            "ttl_seconds": ttl_ms // 1000,
            "expected_version": expected_version,
            "execution_key": proof.execution_key,
        }
        data, replayed = self._call(
            "POST",
            f"/v1/leases/{_seg(proof.lease_id)}/renew",
            json=body,
            idempotency_key=idempotency_key,
        )
        return self._lease(data, replayed)

    def transfer(
        self,
        caller: Caller,
        proof: Proof,
        *,
        to_principal: str,
        new_execution_key: str,
        ttl_ms: int,
        expected_version: int | None,
        idempotency_key: str | None = None,
    ) -> Lease:
        """``POST /v1/leases/{id}/transfer`` with the proof's execution key (and the
        ``Idempotency-Key`` header when a key is given)."""
        body = {
            "to_principal": to_principal,
            "new_execution_key": new_execution_key,
            "ttl_seconds": ttl_ms // 1000,
            "expected_version": expected_version,
            "execution_key": proof.execution_key,
        }
        data, replayed = self._call(
            "POST",
            f"/v1/leases/{_seg(proof.lease_id)}/transfer",
            json=body,
            idempotency_key=idempotency_key,
        )
        return self._lease(data, replayed)

    def release(
        self,
        caller: Caller,
        proof: Proof,
        *,
        expected_version: int | None,
        idempotency_key: str | None = None,
    ) -> Receipt:
        """``POST /v1/leases/{id}/release`` (by proof; ``Idempotency-Key`` when given)."""
        body = {"execution_key": proof.execution_key, "expected_version": expected_version}
        data, replayed = self._call(
            "POST",
            f"/v1/leases/{_seg(proof.lease_id)}/release",
            json=body,
            idempotency_key=idempotency_key,
        )
        return self._parse(Receipt, data, replayed=replayed)

    def release_by_id(
        self, caller: Caller, lease_id: str, *, idempotency_key: str | None = None
    ) -> Receipt:
        """``DELETE /v1/leases/{id}`` (``Idempotency-Key`` when given)."""
        data, replayed = self._call(
            "DELETE", f"/v1/leases/{_seg(lease_id)}", idempotency_key=idempotency_key
        )
        receipt = {"action": "release_by_id", "replayed": replayed}
        if isinstance(data, dict):
            receipt |= {"status": data.get("status"), "lease": data.get("lease")}
        return self._parse(Receipt, receipt)

    def force_release(
        self, caller: Caller, lease_id: str, *, idempotency_key: str | None = None
    ) -> Receipt:
        """``POST /v1/leases/{id}/force-release`` (``Idempotency-Key`` when given)."""
        data, replayed = self._call(
            "POST", f"/v1/leases/{_seg(lease_id)}/force-release", idempotency_key=idempotency_key
        )
        return self._parse(Receipt, data, replayed=replayed)

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

    def list_leases(
        self,
        caller: Caller,
        *,
        resource_type: str | None = None,
        owner: str | None = None,
        include_ended: bool = False,
        limit: int = 100,
    ) -> list[Lease]:
        """``GET /v1/leases``."""
        params = _params(
            resource_type=resource_type,
            owner=owner,
            include_ended="true" if include_ended else None,
            limit=limit,
        )
        data, _ = self._call("GET", "/v1/leases", params=params)
        return self._list(Lease, data, "leases")

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
        self,
        caller: Caller,
        subject_id: str,
        kind: str,
        state: dict[str, Any],
        *,
        state_text: str,
        state_hash: str,
        expected_version: int | None,
        fence: Fence | None,
        idempotency_key: str | None,
        ttl_ms: int | None,
    ) -> Checkpoint:
        """``PUT /v1/checkpoints`` (the fence as ``fence_lease_id`` + ``fence_epoch``)."""
        body = {
            "subject_id": subject_id,
            "kind": kind,
            "state": state,
            "expected_version": expected_version,
            "fence_lease_id": fence.lease_id if fence else None,
            "fence_epoch": fence.epoch if fence else None,
            "ttl_seconds": ttl_ms // 1000 if ttl_ms is not None else None,
        }
        data, replayed = self._call(
            "PUT", "/v1/checkpoints", json=body, idempotency_key=idempotency_key
        )
        return self._parse(Checkpoint, data, replayed=replayed)

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

    def checkpoint_get_by_id(self, caller: Caller, checkpoint_id: str) -> Checkpoint:
        """``GET /v1/checkpoints/{id}``."""
        data, _ = self._call("GET", f"/v1/checkpoints/{_seg(checkpoint_id)}")
        return self._parse(Checkpoint, data)

    def checkpoint_history(
        self, caller: Caller, subject_id: str, kind: str, principal: str | None = None
    ) -> list[Checkpoint]:
        """``GET /v1/checkpoints/history``."""
        params = _params(subject_id=subject_id, kind=kind, principal=principal)
        data, _ = self._call("GET", "/v1/checkpoints/history", params=params)
        return self._list(Checkpoint, data, "checkpoints")

    # ------------------------------------------------------------------ handoffs

    def handoff_create(
        self,
        caller: Caller,
        to_principal: str,
        subject_id: str,
        *,
        checkpoint_id: str | None,
        context_id: str | None,
        message: str | None,
        lease: Proof | None,
        expires_in_ms: int | None,
        idempotency_key: str | None,
    ) -> Handoff:
        """``POST /v1/handoffs``."""
        body = {
            "to_principal": to_principal,
            "subject_id": subject_id,
            "checkpoint_id": checkpoint_id,
            "context_id": context_id,
            "message": message,
            "lease_id": lease.lease_id if lease else None,
            "expires_in_seconds": expires_in_ms // 1000 if expires_in_ms is not None else None,
        }
        if lease is not None:
            body["lease_execution_key"] = lease.execution_key
        data, replayed = self._call(
            "POST", "/v1/handoffs", json=body, idempotency_key=idempotency_key
        )
        return self._parse(Handoff, data, replayed=replayed)

    def handoff_inbox(self, caller: Caller, *, limit: int = 100) -> list[Handoff]:
        """``GET /v1/handoffs``."""
        data, _ = self._call("GET", "/v1/handoffs", params={"limit": limit})
        return self._list(Handoff, data, "handoffs")

    def handoff_get(self, caller: Caller, handoff_id: str) -> Handoff:
        """``GET /v1/handoffs/{id}``."""
        data, _ = self._call("GET", f"/v1/handoffs/{_seg(handoff_id)}")
        return self._parse(Handoff, data)

    def handoff_resolve(
        self,
        caller: Caller,
        handoff_id: str,
        status: str,
        *,
        note: str | None,
        execution_key: str | None,
        ttl_ms: int | None,
        idempotency_key: str | None = None,
    ) -> Handoff:
        """``POST /v1/handoffs/{id}/resolve`` (``Idempotency-Key`` when given)."""
        body = {
            "status": status,
            "note": note,
            "execution_key": execution_key,
            "ttl_seconds": ttl_ms // 1000 if ttl_ms is not None else None,
        }
        data, replayed = self._call(
            "POST",
            f"/v1/handoffs/{_seg(handoff_id)}/resolve",
            json=body,
            idempotency_key=idempotency_key,
        )
        return self._parse(Handoff, data, replayed=replayed)

    # ------------------------------------------------------------------ outcomes, events

    def outcome_record(
        self,
        caller: Caller,
        subject_id: str,
        status: str,
        *,
        evidence: Sequence[Evidence],
        fence: Fence | None,
        lease_id: str | None,
        handoff_id: str | None,
        checkpoint_id: str | None,
        idempotency_key: str | None,
    ) -> Outcome:
        """``POST /v1/outcomes``."""
        body = {
            "subject_id": subject_id,
            "status": status,
            "evidence": [e.model_dump() for e in evidence],
            "fence_lease_id": fence.lease_id if fence else None,
            "fence_epoch": fence.epoch if fence else None,
            "lease_id": lease_id,
            "handoff_id": handoff_id,
            "checkpoint_id": checkpoint_id,
        }
        data, replayed = self._call(
            "POST", "/v1/outcomes", json=body, idempotency_key=idempotency_key
        )
        return self._parse(Outcome, data, replayed=replayed)

    def outcome_list(
        self, caller: Caller, subject_id: str | None = None, *, limit: int = 1000
    ) -> list[Outcome]:
        """``GET /v1/outcomes``."""
        params = _params(subject_id=subject_id, limit=limit)
        data, _ = self._call("GET", "/v1/outcomes", params=params)
        return self._list(Outcome, data, "outcomes")

    def events_list(
        self, caller: Caller, *, after_seq: int = 0, limit: int = 100, kind: str | None = None
    ) -> list[Event]:
        """``GET /v1/events``."""
        params = _params(after=after_seq, limit=limit, kind=kind)
        data, _ = self._call("GET", "/v1/events", params=params)
        return self._list(Event, data, "events")
