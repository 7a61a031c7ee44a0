"""Success response schemas of the REST API, for the OpenAPI document.

Every ``/v1`` route answers ``{"data": <data>, "meta": {"request_id": str, "replayed":
bool}}``. :data:`DATA_BY_OPERATION` names the model of ``data`` for each operation
(``(method, path)``); :func:`success_schemas` turns them into JSON schemas built from the
real models of :mod:`prefect_baton.models`, without their ``replayed`` field (the app moves
that flag into ``meta``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema

from prefect_baton.models import (
    Checkpoint,
    EndStatus,
    Event,
    Handoff,
    Lease,
    LeaseInfo,
    Outcome,
    Receipt,
)

__all__ = [
    "DATA_BY_OPERATION",
    "BatchAcquired",
    "CheckpointPage",
    "EventPage",
    "HandoffPage",
    "LeaseList",
    "LeasePage",
    "Me",
    "Meta",
    "OutcomePage",
    "ReconcilerLag",
    "Released",
    "success_schemas",
]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Meta(_Out):
    """``meta`` of every success envelope: the request id (also the ``X-Request-ID``
    header) and whether the result was replayed from a stored idempotency receipt."""

    request_id: str
    replayed: bool


class LeaseList(_Out):
    """A list of leases: ``POST /v1/leases/report-expired`` (those reported), MCP
    ``baton_lease_acquire_many`` (those acquired, in request order)."""

    leases: list[Lease]


class LeasePage(_Out):
    """``GET /v1/leases``: one page of the caller's leases, newest first; ``next_cursor``
    continues the list (``cursor=``), ``None`` after the last page."""

    leases: list[Lease]
    next_cursor: str | None


class HandoffPage(_Out):
    """``GET /v1/handoffs``: one page of the caller's inbox, oldest first;
    ``next_cursor`` as for :class:`LeasePage`."""

    handoffs: list[Handoff]
    next_cursor: str | None


class CheckpointPage(_Out):
    """``GET /v1/checkpoints/history``: one page of a checkpoint's versions, oldest first;
    ``next_cursor`` as for :class:`LeasePage`."""

    checkpoints: list[Checkpoint]
    next_cursor: str | None


class OutcomePage(_Out):
    """``GET /v1/outcomes``: one page of the org's outcomes, oldest first; ``next_cursor``
    as for :class:`LeasePage`."""

    outcomes: list[Outcome]
    next_cursor: str | None


class EventPage(_Out):
    """``GET /v1/events``: one page of events in commit order; ``next_cursor`` as for
    :class:`LeasePage` (the same as ``after=`` the last ``seq``)."""

    events: list[Event]
    next_cursor: str | None


class BatchAcquired(_Out):
    """``POST /v1/leases/batch``: the leases acquired, in request order, and per lease
    whether it came back from a stored receipt."""

    leases: list[Lease]
    replayed: list[bool]


class Me(_Out):
    """``GET /v1/me`` (MCP ``baton_whoami``): the caller's identity, the scopes granted
    (``None``: every one, as over MCP stdio), the bearer key's id (``None`` without a key)
    and the server's checkpoint state limit (``state_max_bytes``, bytes of canonical
    JSON)."""

    org: str
    principal: str
    role: str
    scopes: list[str] | None
    key_id: str | None
    state_max_bytes: int


class ReconcilerLag(_Out):
    """``GET /v1/reconciler/lag``: the lease authority (``ledger`` or ``redis``) and, with
    Redis, how many journal entries of the caller's org the ledger has not applied yet and
    how old the oldest is (``seconds`` on the Redis clock); both 0 on the ledger."""

    authority: Literal["ledger", "redis"]
    entries: int
    seconds: float


class Released(_Out):
    """``DELETE /v1/leases/{lease_id}``: the released lease and how it ended
    (``released``, or ``expired`` when it had already run out)."""

    lease_id: str
    released_at: datetime | None
    status: EndStatus
    lease: Lease


#: Model of ``data`` per ``(METHOD, path)`` of every ``/v1`` operation.
DATA_BY_OPERATION: dict[tuple[str, str], type[BaseModel]] = {
    ("POST", "/v1/leases"): Lease,
    ("GET", "/v1/leases"): LeasePage,
    ("GET", "/v1/leases/inspect"): LeaseInfo,
    ("GET", "/v1/leases/{lease_id}"): Lease,
    ("DELETE", "/v1/leases/{lease_id}"): Released,
    ("POST", "/v1/leases/{lease_id}/release"): Receipt,
    ("POST", "/v1/leases/batch"): BatchAcquired,
    ("POST", "/v1/leases/report-expired"): LeaseList,
    ("POST", "/v1/leases/{lease_id}/renew"): Lease,
    ("POST", "/v1/leases/{lease_id}/transfer"): Lease,
    ("POST", "/v1/leases/{lease_id}/force-release"): Receipt,
    ("POST", "/v1/handoffs"): Handoff,
    ("GET", "/v1/handoffs"): HandoffPage,
    ("GET", "/v1/handoffs/{handoff_id}"): Handoff,
    ("POST", "/v1/handoffs/{handoff_id}/resolve"): Handoff,
    ("PUT", "/v1/checkpoints"): Checkpoint,
    ("POST", "/v1/checkpoints"): Checkpoint,
    ("GET", "/v1/checkpoints"): Checkpoint,
    ("GET", "/v1/checkpoints/history"): CheckpointPage,
    ("GET", "/v1/checkpoints/{checkpoint_id}"): Checkpoint,
    ("DELETE", "/v1/checkpoints/{checkpoint_id}"): Checkpoint,
    ("POST", "/v1/outcomes"): Outcome,
    ("GET", "/v1/outcomes"): OutcomePage,
    ("GET", "/v1/events"): EventPage,
    ("GET", "/v1/me"): Me,
    ("GET", "/v1/reconciler/lag"): ReconcilerLag,
}

_REF = "#/components/schemas/{model}"


def _drop_replayed(schema: dict[str, Any]) -> None:
    props = schema.get("properties")
    if isinstance(props, dict) and "replayed" in props:
        del props["replayed"]
        required = [r for r in schema.get("required", []) if r != "replayed"]
        if required:
            schema["required"] = required
        else:
            schema.pop("required", None)


def success_schemas(
    models: dict[tuple[str, str], type[BaseModel]] | None = None,
) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[str, Any]]:
    """The success envelope schema of every operation, and the component schemas it uses.

    Args:
        models: ``{(METHOD, path): model of data}`` (default :data:`DATA_BY_OPERATION`).

    Returns:
        ``(envelopes, components)``: ``envelopes[(METHOD, path)]`` is the JSON schema of
        ``{"data": ..., "meta": ...}`` (referring to ``#/components/schemas/...``);
        ``components`` maps schema names to the schemas of the models, serialised as the
        app sends them (``replayed`` removed).
    """
    chosen = DATA_BY_OPERATION if models is None else models
    unique: list[type[BaseModel]] = list(dict.fromkeys([Meta, *chosen.values()]))
    keys, top = models_json_schema([(m, "serialization") for m in unique], ref_template=_REF)
    components: dict[str, Any] = dict(top.get("$defs", {}))
    meta_ref = keys[(Meta, "serialization")]
    # Only the models of prefect_baton.models carry a ``replayed`` flag the app drops; the
    # envelopes of this module (``Meta``, ``BatchAcquired``) send theirs.
    own = {
        keys[(m, "serialization")]["$ref"].rsplit("/", 1)[-1]
        for m in unique
        if m.__module__ == __name__
    }
    for name, schema in components.items():
        if name not in own:
            _drop_replayed(schema)
    envelopes: dict[tuple[str, str], dict[str, Any]] = {}
    for op, model in chosen.items():
        envelopes[op] = {
            "type": "object",
            "required": ["data", "meta"],
            "additionalProperties": False,
            "properties": {"data": keys[(model, "serialization")], "meta": meta_ref},
        }
    return envelopes, components
