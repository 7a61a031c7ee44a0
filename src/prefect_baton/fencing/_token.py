"""The fencing token of a lease, and its HTTP form (the ``Baton-Fencing-Token`` header)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, unquote

from prefect_baton._rules.core import check_fencing_token
from prefect_baton._rules.validation import validate_id, validate_version
from prefect_baton.errors import StaleFenceError, ValidationError
from prefect_baton.metrics._state import record as record_metric

__all__ = [
    "RESOURCE_HEADER",
    "TOKEN_HEADER",
    "Fenceable",
    "FencingToken",
    "headers",
    "token_from_headers",
]

#: The request header carrying the writer's fencing token: the lease's epoch, in decimal.
TOKEN_HEADER = "Baton-Fencing-Token"
#: The request header naming the resource the token belongs to:
#: ``<resource_type>/<resource_id>``, each part percent-encoded (``/`` inside a part is
#: ``%2F``). Optional for the server; :func:`headers` always sends it.
RESOURCE_HEADER = "Baton-Fencing-Resource"

_DECIMAL = re.compile(r"[0-9]{1,16}")


class Fenceable(Protocol):
    """Anything that names a lease generation's resource and epoch: a
    :class:`~prefect_baton.models.Lease`, the lease block (``with b.lease(...)``,
    ``current_lease()``) or a :class:`FencingToken`."""

    @property
    def resource_type(self) -> str: ...

    @property
    def resource_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...


@dataclass(frozen=True, slots=True)
class FencingToken:
    """A lease's fencing token as a guard sees it: the resource and the epoch.

    Epochs rise per resource (organization, resource type, resource id) for all time, so a
    token compares only with tokens of the same resource.

    Attributes:
        resource_type, resource_id: the leased resource (``str``, 1 to 256 characters, no
            control characters, as the lease's).
        epoch: the lease's epoch (``int``, 0 to 2**53 - 1).

    Raises:
        ValidationError: a field is out of those bounds (at construction).
    """

    resource_type: str
    resource_id: str
    epoch: int

    def __post_init__(self) -> None:
        validate_id("resource_type", self.resource_type)
        validate_id("resource_id", self.resource_id)
        if validate_version("fencing token (epoch)", self.epoch) is None:
            raise ValidationError("fencing token (epoch) must be an integer, got None")

    @classmethod
    def of(cls, fence: Fenceable) -> FencingToken:
        """The token of ``fence`` (a :class:`~prefect_baton.models.Lease`, a lease block or
        a :class:`FencingToken`).

        Raises:
            ValidationError: ``fence`` has no ``resource_type``, ``resource_id`` and
                ``epoch``, or they are out of bounds.
        """
        if isinstance(fence, FencingToken):
            return fence
        try:
            return cls(fence.resource_type, fence.resource_id, fence.epoch)
        except AttributeError:
            raise ValidationError(
                f"a fence must be a Lease, a lease block or a FencingToken, got "
                f"{type(fence).__name__}"
            ) from None

    @property
    def resource(self) -> str:
        """``<resource_type>/<resource_id>``, for messages (ambiguous if an id holds ``/``;
        the HTTP form, :attr:`resource_header`, is not)."""
        return f"{self.resource_type}/{self.resource_id}"

    @property
    def resource_header(self) -> str:
        """The value of the ``Baton-Fencing-Resource`` header for this token."""
        return f"{quote(self.resource_type, safe='')}/{quote(self.resource_id, safe='')}"


def headers(fence: Fenceable) -> dict[str, str]:
    """The request headers that carry ``fence``'s fencing token to a guarded HTTP service.

    ``{"Baton-Fencing-Token": "<epoch>", "Baton-Fencing-Resource": "<type>/<id>"}``
    (see :data:`TOKEN_HEADER`, :data:`RESOURCE_HEADER`). Send them with every write made
    under the lease; the service checks them with
    :func:`prefect_baton.fencing.web.fenced_connection` (or :func:`token_from_headers` and
    :func:`~prefect_baton.fencing.guard`).

    Args:
        fence: a :class:`~prefect_baton.models.Lease`, a lease block or a
            :class:`FencingToken`.

    Raises:
        ValidationError: ``fence`` names no resource and epoch.
    """
    token = FencingToken.of(fence)
    return {TOKEN_HEADER: str(token.epoch), RESOURCE_HEADER: token.resource_header}


def _header(received: Mapping[str, str], name: str) -> str | None:
    """The one value of header ``name`` (any case) in ``received``; ``None`` if absent."""
    lowered = name.lower()
    values = [v for k, v in received.items() if k.lower() == lowered]
    if len(values) > 1:
        raise ValidationError(f"the {name} header is sent {len(values)} times; send it once")
    return values[0].strip() if values else None


def _parse_resource(value: str) -> tuple[str, str]:
    parts = value.split("/")
    if len(parts) != 2:
        raise ValidationError(
            f"the {RESOURCE_HEADER} header must be <resource_type>/<resource_id> with each "
            f"part percent-encoded, got {value[:100]!r}"
        )
    try:
        rtype, rid = (unquote(p, errors="strict") for p in parts)
    except UnicodeDecodeError:
        raise ValidationError(f"the {RESOURCE_HEADER} header is not UTF-8 text") from None
    return validate_id("resource_type", rtype), validate_id("resource_id", rid)


def token_from_headers(
    received: Mapping[str, str], resource_type: str, resource_id: str
) -> FencingToken:
    """The fencing token a request presents for a write to ``resource_type/resource_id``.

    The server names the resource the request writes (from its route, not from the
    client); the ``Baton-Fencing-Token`` header gives the epoch. A ``Baton-Fencing-Resource``
    header, when sent, must name the same resource: a token of another resource means
    nothing here.

    Args:
        received: the request headers (``Mapping[str, str]``, names in any case; a Starlette
            or httpx ``Headers`` works).
        resource_type, resource_id: the resource the request writes (``str``).

    Returns:
        The :class:`FencingToken` to check with :func:`~prefect_baton.fencing.guard`.

    Raises:
        ValidationError: the token header is missing, sent twice, or not a decimal integer
            from 0 to 2**53 - 1; the resource header is malformed (HTTP 400).
        StaleFenceError: the resource header names another resource (HTTP 409).
    """
    raw = _header(received, TOKEN_HEADER)
    if raw is None:
        raise ValidationError(
            f"the {TOKEN_HEADER} header is missing: a write to {resource_type}/{resource_id} "
            "must carry the epoch of its lease (prefect_baton.fencing.headers(lease))"
        )
    if _DECIMAL.fullmatch(raw) is None:
        raise ValidationError(
            f"the {TOKEN_HEADER} header must be a decimal integer (the lease's epoch), "
            f"got {raw[:100]!r}"
        )
    token = FencingToken(resource_type, resource_id, int(raw))
    sent = _header(received, RESOURCE_HEADER)
    if sent is not None and _parse_resource(sent) != (resource_type, resource_id):
        record_metric("baton_stale_fence_rejections", "", resource_type, "http")
        raise StaleFenceError(
            f"the fencing token sent is for resource {unquote(sent)[:200]}, not "
            f"{token.resource}: it cannot fence this write"
        )
    return token


def checked_token(highest: int | None, token: FencingToken, where: str) -> int:
    """:func:`~prefect_baton._rules.core.check_fencing_token` of ``token`` against the
    ``highest`` token that has written (``int`` or ``None``), counting a rejection on
    ``baton_stale_fence_rejections`` (organization empty, ``where``: ``sql`` or ``object``).

    Returns:
        The highest token once this write lands (``int``).

    Raises:
        StaleFenceError: a higher token has written.
    """
    try:
        return check_fencing_token(highest, token.epoch, resource=token.resource)
    except StaleFenceError:
        record_metric("baton_stale_fence_rejections", "", token.resource_type, where)
        raise
