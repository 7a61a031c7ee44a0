"""HTTP transport of :class:`~prefect_baton._stores.rest.client.RestStore`: URL and key checks,
one pooled :class:`httpx.Client`, the ``{"data": ..., "meta": ...}`` envelope, the
JSON-to-model parsing and the mapping of failures to
:class:`~prefect_baton.errors.BatonError` subclasses.

Mapping of what is not an error envelope of the API:

* no connection, a timeout or another transport failure: :class:`UnavailableError`;
* ``401``: :class:`UnauthenticatedError` (code ``UNAUTHENTICATED``); ``403``:
  :class:`ForbiddenError`; ``413``: :class:`ValidationError`; ``502``/``503``/``504`` or any
  other ``5xx`` without an envelope: :class:`UnavailableError`;
* an answer this client cannot read (a body that does not match the model, an error with an
  unknown code or malformed fields, another status, a redirect, which is never followed):
  :class:`UnavailableError` for an operation; for ``GET /v1/me`` (when the client is made)
  :class:`ValidationError`, "does not serve the prefect-baton REST API".

The key is kept as a :class:`pydantic.SecretStr` and appears in no log, repr or message.
"""

from __future__ import annotations

import string
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, SecretStr
from pydantic import ValidationError as PydanticValidationError

from prefect_baton.errors import (
    BatonError,
    ForbiddenError,
    NotFoundError,
    UnauthenticatedError,
    UnavailableError,
    ValidationError,
    error_for_code,
)

#: Seconds a request may take (connect, each read and write) before it is ``UNAVAILABLE``.
DEFAULT_TIMEOUT_SECONDS = 30.0

_KEY_CHARS = frozenset(string.ascii_letters + string.digits + string.punctuation)

_M = TypeVar("_M", bound=BaseModel)


class _UnreadableAnswer(UnavailableError):
    """An answer that is not this REST API's (wrong shape, unknown status or code, a
    redirect): ``UNAVAILABLE`` for an operation, ``VALIDATION_ERROR`` for ``GET /v1/me``."""


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


class _Transport:
    """The REST API at ``api_url`` over one :class:`httpx.Client` (arguments as
    :class:`~prefect_baton._stores.rest.client.RestStore`)."""

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

    def close(self) -> None:
        """Close the connection pool (when this store created it)."""
        if self._owns_client:
            self._http.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        timeout_seconds: float | None = None,
    ) -> tuple[Any, bool]:
        """One request; ``timeout_seconds`` (``float``) bounds it below the client's own
        timeout (it never raises it)."""
        limit = self.timeout_seconds
        if timeout_seconds is not None:
            limit = min(limit, timeout_seconds)
        headers = {b"Authorization": f"Bearer {self._key.get_secret_value()}".encode("ascii")}
        if idempotency_key is not None:  # sent as UTF-8 bytes; the app reads them so
            headers[b"Idempotency-Key"] = idempotency_key.encode("utf-8")
        try:
            resp = self._http.request(
                method, path, json=json, params=params, headers=headers, timeout=limit
            )
        except httpx.TimeoutException:
            raise UnavailableError(
                f"the REST API at {self.url} did not answer within {limit:g} s"
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
