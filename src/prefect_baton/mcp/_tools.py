"""The MCP tools: one input model (unknown fields rejected, types strict; in
:mod:`prefect_baton.mcp._inputs`) and one thin call into :class:`~prefect_baton.Baton` per
tool.

A tool returns the JSON form (``model_dump(mode="json")``) of what the Python API returns;
lists come wrapped in an object (``{"handoffs": [...]}``), because a tool's structured
result is a JSON object.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from prefect_baton._client.leases import fence_by_id
from prefect_baton._client.sync import Baton
from prefect_baton.errors import NotFoundError, ValidationError
from prefect_baton.mcp._inputs import (
    CheckpointDeleteIn,
    CheckpointGetIn,
    CheckpointHistoryIn,
    CheckpointSaveIn,
    EventListIn,
    HandoffCreateIn,
    HandoffInboxIn,
    HandoffResolveIn,
    HandoffShowIn,
    LeaseAcquireIn,
    LeaseAcquireManyIn,
    LeaseByIdIn,
    LeaseForceReleaseIn,
    LeaseListIn,
    LeaseReleaseIn,
    LeaseTransferIn,
    OutcomeListIn,
    OutcomeRecordIn,
    WhoAmIIn,
)
from prefect_baton.models import Checkpoint, Handoff, Lease, LeaseInfo, Outcome, Receipt
from prefect_baton.rest import _calls as rest_calls
from prefect_baton.rest._responses import (
    CheckpointPage,
    EventPage,
    HandoffPage,
    LeaseList,
    LeasePage,
    Me,
    OutcomePage,
)
from prefect_baton.rest._schemas import ResourceIn

__all__ = ["SEED_ALIASES", "TOOLS", "Grant", "SeedAlias", "ToolSpec", "find_tool"]


def _json(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")


def _fence(b: Baton, lease_id: str | None, epoch: int | None) -> Lease | None:
    """The lease generation ``lease_id`` presented with ``epoch`` as a fence.

    Raises:
        StaleFenceError: the id is not one of the caller's leases (the store then judges
            an ended, expired or wrong-epoch generation the same way).
    """
    if lease_id is None or epoch is None:
        return None
    return fence_by_id(b.leases, lease_id, epoch)


def _lease_acquire(b: Baton, a: LeaseAcquireIn) -> dict[str, Any]:
    return _json(rest_calls.acquire(b, a, a.idempotency_key))


def _lease_renew(b: Baton, a: LeaseByIdIn) -> dict[str, Any]:
    lease = b.leases.get(a.lease_id)
    return _json(rest_calls.renew(b, lease, a, a.idempotency_key))


def _lease_release(b: Baton, a: LeaseReleaseIn) -> dict[str, Any]:
    lease = b.leases.get(a.lease_id)
    return _json(rest_calls.release(b, lease, a.expected_version, a.idempotency_key))


def _lease_inspect(b: Baton, a: ResourceIn) -> dict[str, Any]:
    return _json(b.leases.inspect(a.resource_type, a.resource_id))


def _checkpoint_save(b: Baton, a: CheckpointSaveIn) -> dict[str, Any]:
    fence = _fence(b, a.lease_id, a.epoch)
    return _json(rest_calls.save_checkpoint(b, a, fence, a.idempotency_key))


def _checkpoint_get(b: Baton, a: CheckpointGetIn) -> dict[str, Any]:
    if a.checkpoint_id is not None:
        return _json(b.checkpoints.get_by_id(a.checkpoint_id))
    assert a.subject_id is not None and a.kind is not None  # the model checked it
    found = b.checkpoints.get(a.subject_id, a.kind, a.principal)
    if found is None:
        raise NotFoundError(f"no checkpoint of {a.subject_id}/{a.kind}")
    return _json(found)


def _handoff_create(b: Baton, a: HandoffCreateIn) -> dict[str, Any]:
    lease = b.leases.get(a.lease_id) if a.lease_id is not None else None
    return _json(rest_calls.create_handoff(b, a, lease, a.idempotency_key))


def _handoff_inbox(b: Baton, a: HandoffInboxIn) -> dict[str, Any]:
    return _json(rest_calls.handoffs_page(b, a))


def _lease_transfer(b: Baton, a: LeaseTransferIn) -> dict[str, Any]:
    lease = b.leases.get(a.lease_id)
    return _json(rest_calls.transfer(b, lease, a, a.idempotency_key))


def _lease_force_release(b: Baton, a: LeaseForceReleaseIn) -> dict[str, Any]:
    return _json(rest_calls.force_release(b, a.lease_id, a.idempotency_key))


def _lease_acquire_many(b: Baton, a: LeaseAcquireManyIn) -> dict[str, Any]:
    leases = rest_calls.acquire_many(b, a, a.idempotency_key)
    return _json(LeaseList(leases=leases))


def _lease_list(b: Baton, a: LeaseListIn) -> dict[str, Any]:
    return _json(rest_calls.leases_page(b, a))


def _event_list(b: Baton, a: EventListIn) -> dict[str, Any]:
    return _json(rest_calls.events_page(b, a))


def _checkpoint_history(b: Baton, a: CheckpointHistoryIn) -> dict[str, Any]:
    return _json(rest_calls.checkpoint_history(b, a))


def _checkpoint_delete(b: Baton, a: CheckpointDeleteIn) -> dict[str, Any]:
    return _json(rest_calls.delete_checkpoint(b, a.checkpoint_id, a.idempotency_key))


def _outcome_list(b: Baton, a: OutcomeListIn) -> dict[str, Any]:
    return _json(rest_calls.outcomes_page(b, a))


def _whoami(b: Baton, _a: WhoAmIIn, grant: Grant) -> dict[str, Any]:
    return _json(rest_calls.me(b, grant.scopes, grant.key_id))


def _handoff_resolve(b: Baton, a: HandoffResolveIn) -> dict[str, Any]:
    return _json(rest_calls.resolve_handoff(b, a.handoff_id, a, a.idempotency_key))


def _handoff_show(b: Baton, a: HandoffShowIn) -> dict[str, Any]:
    return _json(b.handoffs.get(a.handoff_id))


def _outcome_record(b: Baton, a: OutcomeRecordIn) -> dict[str, Any]:
    fence = _fence(b, a.lease_id, a.epoch)
    return _json(rest_calls.record_outcome(b, a, fence, a.idempotency_key))


@dataclass(frozen=True, slots=True)
class Grant:
    """What one MCP connection's credentials grant, beside its identity.

    Attributes:
        scopes: the bearer key's scopes (``frozenset[str]``), or ``None`` (every tool, as
            over stdio, where the process is trusted like every ``baton`` command).
        key_id: the bearer key's id (``str``), or ``None`` (stdio: no key).
    """

    scopes: Collection[str] | None
    key_id: str | None


@dataclass(frozen=True)
class ToolSpec:
    """One MCP tool.

    Attributes:
        name: the tool name (``baton_<area>_<verb>``).
        description: what it does and how it fails, for the agent reading the tool list.
        model: the input model (its JSON schema is the tool's ``inputSchema``).
        run: ``run(baton, args) -> dict`` (``run(baton, args, grant)`` when
            ``with_grant``), the thin call into :mod:`prefect_baton.rest._calls` (the
            REST API's own); raises :class:`~prefect_baton.errors.BatonError` subclasses.
        output: the model whose JSON form ``run`` returns (its serialization schema is
            the tool's ``outputSchema``).
        scope: the bearer-key scope it needs over HTTP (``<area>:read`` / ``<area>:write``),
            or ``None`` (any key).
        read_only: whether it changes nothing (the ``readOnlyHint`` annotation).
        with_grant: ``run`` also takes the connection's :class:`Grant`.
    """

    name: str
    description: str
    model: type[BaseModel]
    run: Callable[..., dict[str, Any]]
    output: type[BaseModel]
    scope: str | None
    read_only: bool = False
    with_grant: bool = False


_SPECS = (
    ToolSpec(
        "baton_lease_acquire",
        "Claim expiring ownership of one resource before doing work on it. Returns the "
        "lease (lease_id, epoch = fencing token, version, expires_at). Errors: CONFLICT "
        "while another holder has it (the message gives only the expiry), VERSION_CONFLICT, "
        "IDEMPOTENCY_MISMATCH, LEASE_LOST (a replayed acquire whose lease has ended).",
        LeaseAcquireIn,
        _lease_acquire,
        Lease,
        "leases:write",
    ),
    ToolSpec(
        "baton_lease_renew",
        "Extend a lease you hold: expiry = now + ttl_seconds; id and epoch stay. Errors: "
        "LEASE_LOST once it has ended or expired (never silently re-acquired), NOT_FOUND "
        "for a lease that is not yours.",
        LeaseByIdIn,
        _lease_renew,
        Lease,
        "leases:write",
    ),
    ToolSpec(
        "baton_lease_release",
        "Release a lease you hold. The receipt's status is 'released', 'expired' (your "
        "protection had lapsed) or 'no_change' (already released: safe to retry). Errors: "
        "LEASE_LOST when someone else has taken it since, NOT_FOUND when not yours.",
        LeaseReleaseIn,
        _lease_release,
        Receipt,
        "leases:write",
    ),
    ToolSpec(
        "baton_lease_inspect",
        "Whether a resource is held and until when, with its version and epoch. Only the "
        "holder sees the full lease.",
        ResourceIn,
        _lease_inspect,
        LeaseInfo,
        "leases:read",
        read_only=True,
    ),
    ToolSpec(
        "baton_checkpoint_save",
        "Save your resumable progress for (subject_id, kind); version +1 per write. Pass "
        "lease_id and epoch to fence the write with a lease you hold. Errors: STALE_FENCE, "
        "VERSION_CONFLICT (expected_version differs), IDEMPOTENCY_MISMATCH.",
        CheckpointSaveIn,
        _checkpoint_save,
        Checkpoint,
        "checkpoints:write",
    ),
    ToolSpec(
        "baton_checkpoint_get",
        "Read the current checkpoint of (subject_id, kind) (yours unless principal is "
        "given), or one by checkpoint_id (e.g. attached to a handoff). Errors: NOT_FOUND.",
        CheckpointGetIn,
        _checkpoint_get,
        Checkpoint,
        "checkpoints:read",
        read_only=True,
    ),
    ToolSpec(
        "baton_handoff_create",
        "Hand a subject to another principal, optionally with a checkpoint and a lease you "
        "hold (it moves to the recipient when they accept). Errors: NOT_FOUND (unknown "
        "checkpoint or lease), LEASE_LOST, VALIDATION_ERROR (a handoff to yourself).",
        HandoffCreateIn,
        _handoff_create,
        Handoff,
        "handoffs:write",
    ),
    ToolSpec(
        "baton_handoff_inbox",
        "The pending handoffs addressed to you, oldest first, as {'handoffs': [...], "
        "'next_cursor': ...} (a sender's own inbox stays empty); pass next_cursor as "
        "cursor for the next page (null: no more). With party: the handoffs that principal "
        "sent or received, or party '*' for everyone's in the organization, of status "
        "(default pending). Errors: FORBIDDEN (another's or everyone's without the "
        "owner/admin role), VALIDATION_ERROR (status without party).",
        HandoffInboxIn,
        _handoff_inbox,
        HandoffPage,
        "handoffs:read",
        read_only=True,
    ),
    ToolSpec(
        "baton_handoff_resolve",
        "Accept or reject a pending handoff addressed to you. Accepting one that carries a "
        "lease gives you that lease (in the result's 'lease'). Errors: NOT_FOUND (unknown, "
        "expired, also when the sender's lease ended, or already resolved), VALIDATION_ERROR "
        "(not addressed to you), LEASE_LOST (the sender's lease ended during the call).",
        HandoffResolveIn,
        _handoff_resolve,
        Handoff,
        "handoffs:write",
    ),
    ToolSpec(
        "baton_handoff_show",
        "One handoff you sent or received, with its status. Errors: NOT_FOUND.",
        HandoffShowIn,
        _handoff_show,
        Handoff,
        "handoffs:read",
        read_only=True,
    ),
    ToolSpec(
        "baton_outcome_record",
        "Record 'succeeded', 'failed' or 'cancelled' for a subject with evidence items "
        "(kind, uri, digest, note). Pass lease_id and epoch to fence it with a lease you "
        "hold. Errors: STALE_FENCE, NOT_FOUND (a linked id), IDEMPOTENCY_MISMATCH.",
        OutcomeRecordIn,
        _outcome_record,
        Outcome,
        "outcomes:write",
    ),
    ToolSpec(
        "baton_lease_transfer",
        "Hand a lease you hold to another principal under a new execution key: the "
        "receiver's lease (new lease_id, epoch + 1) is returned and yours ends. Errors: "
        "LEASE_LOST, VERSION_CONFLICT, VALIDATION_ERROR (the same execution key), NOT_FOUND.",
        LeaseTransferIn,
        _lease_transfer,
        Lease,
        "leases:write",
    ),
    ToolSpec(
        "baton_lease_force_release",
        "Release anyone's lease of the organization (owner or admin role only); the "
        "receipt says forced: true. Errors: FORBIDDEN (agent role), NOT_FOUND.",
        LeaseForceReleaseIn,
        _lease_force_release,
        Receipt,
        "leases:write",
    ),
    ToolSpec(
        "baton_lease_acquire_many",
        "Acquire several resources (1 to 1000) all-or-nothing, as {'leases': [...]} in "
        "request order; unset item fields take the call's ttl_seconds, purpose and scopes. "
        "Errors: the first refused item's (CONFLICT, VERSION_CONFLICT, ...); nothing is "
        "acquired then.",
        LeaseAcquireManyIn,
        _lease_acquire_many,
        LeaseList,
        "leases:write",
    ),
    ToolSpec(
        "baton_lease_list",
        "Your effective leases, newest first, as {'leases': [...], 'next_cursor': ...}: "
        "find a lease_id you lost. include_ended adds ended ones; owner (owner/admin role) "
        "lists another principal's. Pass next_cursor as cursor for the next page.",
        LeaseListIn,
        _lease_list,
        LeasePage,
        "leases:read",
        read_only=True,
    ),
    ToolSpec(
        "baton_event_list",
        "The organization's events in commit order (lease.acquired, checkpoint.saved, "
        "handoff.created, ...), as {'events': [...], 'next_cursor': ...}; pass next_cursor "
        "as cursor (or the last seq as after) for the next page. Filters: kind; "
        "resource_type with resource_id (both or neither); subject.",
        EventListIn,
        _event_list,
        EventPage,
        "events:read",
        read_only=True,
    ),
    ToolSpec(
        "baton_checkpoint_history",
        "The saved versions of a checkpoint of (subject_id, kind), oldest first, one page "
        "as {'checkpoints': [...], 'next_cursor': ...}; pass next_cursor as cursor for the "
        "next page (null: no more). Errors: NOT_FOUND.",
        CheckpointHistoryIn,
        _checkpoint_history,
        CheckpointPage,
        "checkpoints:read",
        read_only=True,
    ),
    ToolSpec(
        "baton_checkpoint_delete",
        "Delete a checkpoint you wrote: it then reads as absent (its history stays). "
        "Errors: NOT_FOUND, FORBIDDEN (not yours), CONFLICT (a pending handoff carries it: "
        "its recipient was promised it).",
        CheckpointDeleteIn,
        _checkpoint_delete,
        Checkpoint,
        "checkpoints:write",
    ),
    ToolSpec(
        "baton_outcome_list",
        "Outcomes of the organization (of one subject when given), oldest first, with their "
        "evidence, as {'outcomes': [...], 'next_cursor': ...}; pass next_cursor as cursor "
        "for the next page (null: no more).",
        OutcomeListIn,
        _outcome_list,
        OutcomePage,
        "outcomes:read",
        read_only=True,
    ),
    ToolSpec(
        "baton_whoami",
        "Who this connection acts as: org, principal, role, the scopes granted (null: all) "
        "and the largest checkpoint state in bytes.",
        WhoAmIIn,
        _whoami,
        Me,
        None,
        read_only=True,
        with_grant=True,
    ),
)

#: Every tool, by name, in the order they are listed.
TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in _SPECS}


@dataclass(frozen=True)
class SeedAlias:
    """A tool name of the seed service, answered by one of :data:`TOOLS` so that an agent
    host configured for the seed service works unchanged.

    Attributes:
        name: the seed's tool name (``titen_...``).
        tool: the tool of :data:`TOOLS` that answers it.
        renames: ``{seed argument: argument of tool}`` for arguments named differently.
        ignored: seed arguments accepted and dropped, with why (no counterpart here).
    """

    name: str
    tool: str
    renames: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)

    def arguments(self, args: dict[str, Any]) -> dict[str, Any]:
        """``args`` (the seed's names) with the arguments of :attr:`tool`.

        Raises:
            ValidationError: a seed argument and the argument it is renamed to are both
                given.
        """
        out: dict[str, Any] = {}
        for key, value in args.items():
            if key in self.ignored:
                continue
            name = self.renames.get(key, key)
            if name in out:
                raise ValidationError(f"{key}: give {key} or {name}, not both")
            out[name] = value
        return out

    def input_schema(self) -> dict[str, Any]:
        """The JSON schema of :attr:`tool`'s input under the seed's argument names."""
        schema = copy.deepcopy(TOOLS[self.tool].model.model_json_schema())
        back = {ours: seed for seed, ours in self.renames.items()}
        props = schema.get("properties", {})
        schema["properties"] = {back.get(k, k): v for k, v in props.items()}
        for arg, why in self.ignored.items():
            schema["properties"][arg] = {"description": f"Accepted and ignored: {why}"}
        if "required" in schema:
            schema["required"] = [back.get(k, k) for k in schema["required"]]
        schema["title"] = self.name
        return schema


_RUN_ID = "runs are not recorded here (use an idempotency_key to make a retry safe)"

#: The seed service's coordination tools (files ``000_*``/``003_*`` of the seeds, and its
#: MCP tool table), by name: the seed's argument names onto this server's tools. Its memory
#: tools (remember, compile, ...) are out of scope (DESIGN.md).
SEED_ALIASES: dict[str, SeedAlias] = {
    alias.name: alias
    for alias in (
        SeedAlias("titen_lease_acquire", "baton_lease_acquire"),
        SeedAlias(
            "titen_checkpoint_save",
            "baton_checkpoint_save",
            ignored={
                "agent_id": "a checkpoint is always the calling principal's own",
                "run_id": _RUN_ID,
            },
        ),
        SeedAlias(
            "titen_checkpoint_get", "baton_checkpoint_get", renames={"agent_id": "principal"}
        ),
        SeedAlias("titen_handoff", "baton_handoff_create"),
    )
}


def find_tool(name: str) -> tuple[ToolSpec, SeedAlias | None] | None:
    """The tool that answers ``name`` (one of :data:`TOOLS`, or a seed alias of
    :data:`SEED_ALIASES`: then the alias too, which renames the call's arguments), or
    ``None`` for an unknown name."""
    spec = TOOLS.get(name)
    if spec is not None:
        return spec, None
    alias = SEED_ALIASES.get(name)
    if alias is None:
        return None
    return TOOLS[alias.tool], alias
