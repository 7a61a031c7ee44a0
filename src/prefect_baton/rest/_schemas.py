"""Request bodies of the REST API. Every model forbids unknown fields and is strict about
types: an integer field takes only a JSON integer (``600``; not ``"600"``, ``600.0`` or
``true``), as the Python API takes only an ``int``; a failure is ``400 VALIDATION_ERROR``.

The declared limits (id lengths, TTL ranges, text lengths) are the ones the Python API
enforces, so the OpenAPI document states what the server accepts; the Python API still
checks everything else (control characters, state size, ...), also with ``400``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from prefect_baton._rules.validation import (
    CHECKPOINT_TTL_MAX_SECONDS,
    MAX_ID_LENGTH,
    MAX_SAFE_INTEGER,
    MAX_SCOPE_LENGTH,
    MAX_SCOPES,
    MAX_TEXT_LENGTH,
    TTL_MAX_SECONDS,
    TTL_MIN_SECONDS,
    check_paired,
)
from prefect_baton._stores.protocol import MAX_MANY
from prefect_baton.errors import ValidationError

__all__ = [
    "AcquireIn",
    "BatchIn",
    "BatchItemIn",
    "CheckpointIn",
    "EvidenceIn",
    "HandoffIn",
    "OutcomeIn",
    "RenewIn",
    "ResolveIn",
    "ResourceIn",
    "TransferIn",
    "paired",
]

#: No control characters (U+0000..U+001F, U+007F) in ids and scopes.
NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"
#: An id (resource, subject, principal, lease, ...): 1 to 256 characters, no control
#: characters.
Id = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH, pattern=NO_CONTROL)]
NO_NUL = r"^[^\x00]*$"
#: Free text (purpose, message, note): at most 4,096 characters, no NUL.
Text = Annotated[str, Field(max_length=MAX_TEXT_LENGTH, pattern=NO_NUL)]
#: The message of a value that does not match one of these patterns.
PATTERN_MESSAGES = {
    NO_CONTROL: "must not contain control characters",
    NO_NUL: "must not contain NUL characters",
}


#: A lease TTL in seconds, ``TTL_MIN_SECONDS`` to ``TTL_MAX_SECONDS``: a JSON integer
#: written without a fraction (``60.0`` is refused, as ``_rules.validation.validate_ttl``
#: refuses a float), like every duration in seconds.
Ttl = Annotated[int, Field(ge=TTL_MIN_SECONDS, le=TTL_MAX_SECONDS, strict=True)]
#: A compare-and-swap version (also an epoch), 0 to 2**53 - 1: a JSON integer, as
#: ``_rules.validation.validate_version`` takes only an ``int`` (``3.0`` is refused).
Version = Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER, strict=True)]
#: A checkpoint or handoff lifetime in seconds, 1 to 31,622,400 (366 days); ``60.0`` is
#: refused, as for :data:`Ttl`.
Lifetime = Annotated[int, Field(ge=1, le=CHECKPOINT_TTL_MAX_SECONDS, strict=True)]
Scope = Annotated[str, Field(min_length=1, max_length=MAX_SCOPE_LENGTH, pattern=NO_CONTROL)]
#: Write-scope patterns of a lease: at most 64, each 1 to 1,024 characters.
Scopes = Annotated[list[Scope], Field(max_length=MAX_SCOPES)]


def paired(model: BaseModel, lead: str, follower: str, what: str, *, lead_alone: bool) -> None:
    """:func:`~prefect_baton._rules.validation.check_paired` of the fields ``lead`` and
    ``follower`` (``str`` names) of ``model``, for a model validator (REST bodies, MCP tool
    inputs): its refusal as a pydantic error, so it reads ``body: <rule>`` (``arguments:
    <rule>`` over MCP) without pydantic's ``Value error,``.

    Raises:
        pydantic_core.PydanticCustomError: the fields are given by halves.
    """
    try:
        check_paired(
            (lead, getattr(model, lead)),
            (follower, getattr(model, follower)),
            what,
            lead_alone=lead_alone,
        )
    except ValidationError as exc:
        raise PydanticCustomError("paired_fields", exc.message) from None


#: An integer as a query parameter writes it: canonical decimal in the ASCII digits 0-9 (no
#: sign, leading zero, underscore, point, exponent, space or other script's digits).
_DECIMAL = re.compile(r"0|[1-9][0-9]*")


def _decimal(value: Any, _handler: ValidatorFunctionWrapHandler) -> Any:
    """The integer ``value`` (a query parameter's text) writes, when written as
    :data:`_DECIMAL` says; else ``value`` as sent, which the client's check of the
    parameter (``_limit``, ``events_after``) then refuses, with the same message as an
    out-of-range integer (``limit must be an integer from 1 to N``). pydantic's own
    reading of a query integer would take ``10.0``, ``1_0``, ``+3`` and `` 3``."""
    if isinstance(value, str) and _DECIMAL.fullmatch(value) is not None:
        try:
            return int(value)
        except ValueError:  # more digits than int() reads: out of every range
            pass
    return value


#: An integer query parameter: an integer in the OpenAPI document; a value written
#: otherwise than :data:`_DECIMAL` reaches the client's check as the text sent, so
#: ``?limit=abc``, ``?limit=1_0`` and ``?limit=0`` get one message. Every integer query
#: parameter of the API has this type.
QueryInt = Annotated[int, WrapValidator(_decimal)]
#: The ``after`` query parameter of the event listing (:data:`QueryInt`; the rule's
#: ``events_after`` decides its range, 0 to 2**63 - 1).
After = QueryInt


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ResourceIn(_In):
    """Name one resource."""

    resource_type: Id
    resource_id: Id


class AcquireIn(ResourceIn):
    """``POST /v1/leases``: acquire a lease (TTL 10..86,400 s); ``attempt`` is the token of
    this attempt of the execution named by the ``Idempotency-Key`` (absent: anonymous)."""

    ttl_seconds: Ttl
    purpose: Text | None = None
    scopes: Scopes = []
    expected_version: Version | None = None
    attempt: Id | None = None


class RenewIn(_In):
    """``POST /v1/leases/{id}/renew``: new TTL (default: the lease's own)."""

    ttl_seconds: Ttl | None = None
    expected_version: Version | None = None


class TransferIn(_In):
    """``POST /v1/leases/{id}/transfer``: hand the lease to another principal."""

    to_principal: Id
    new_execution_key: Id
    ttl_seconds: Ttl
    expected_version: Version | None = None


class HandoffIn(_In):
    """``POST /v1/handoffs``: a pending handoff; ``lease_id`` names a lease you hold that
    accepting transfers to the recipient."""

    to_principal: Id
    subject_id: Id
    checkpoint_id: Id | None = None
    context_id: Id | None = None
    message: Text | None = None
    lease_id: Id | None = None
    expires_in_seconds: Lifetime | None = None
    parameters: dict[str, Any] | None = None


class ResolveIn(_In):
    """``POST /v1/handoffs/{id}/resolve``: ``accepted`` or ``rejected``."""

    status: Literal["accepted", "rejected"]
    note: Text | None = None
    execution_key: Id | None = None
    ttl_seconds: Ttl | None = None


class CheckpointIn(_In):
    """``PUT /v1/checkpoints``: save your checkpoint of ``(subject_id, kind)``;
    ``fence_lease_id`` names a lease you hold that must still be current."""

    subject_id: Id
    kind: Id
    state: dict[str, Any]
    expected_version: Version | None = None
    fence_lease_id: Id | None = None
    ttl_seconds: Lifetime | None = None


#: The kind of an evidence item (e.g. ``file``): an id, as a checkpoint's ``kind``
#: (``_rules.validation.validate_evidence``).
EvidenceKind = Id


class EvidenceIn(_In):
    """One evidence item of an outcome."""

    # the rule of every surface: _rules.validation.validate_evidence

    kind: EvidenceKind
    uri: Annotated[str, Field(min_length=1, max_length=4096, pattern=NO_NUL)]
    digest: Annotated[str, Field(max_length=512, pattern=NO_NUL)] | None = None
    note: Text | None = None


class OutcomeIn(_In):
    """``POST /v1/outcomes``: ``succeeded``, ``failed`` or ``cancelled`` with evidence."""

    subject_id: Id
    status: Literal["succeeded", "failed", "cancelled"]
    evidence: list[EvidenceIn] = []
    fence_lease_id: Id | None = None
    lease_id: Id | None = None
    handoff_id: Id | None = None
    checkpoint_id: Id | None = None


class BatchItemIn(ResourceIn):
    """One resource of ``POST /v1/leases/batch``; unset fields take the call's defaults."""

    ttl_seconds: Ttl | None = None
    purpose: Text | None = None
    scopes: Scopes | None = None
    expected_version: Version | None = None


class BatchIn(_In):
    """``POST /v1/leases/batch``: acquire every resource or none (1..1,000); ``attempt`` as
    in :class:`AcquireIn`."""

    resources: Annotated[list[BatchItemIn], Field(min_length=1, max_length=MAX_MANY)]
    ttl_seconds: Ttl
    purpose: Text | None = None
    scopes: Scopes = []
    attempt: Id | None = None
