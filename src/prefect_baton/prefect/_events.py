"""Ledger events mirrored as Prefect events, so Automations can react to them.

Every ledger event kind ``K`` (``lease.acquired``, ``handoff.created``, ...) becomes the
Prefect event ``prefect-baton.K`` about one resource:

===================  ==============================================================
ledger kind          Prefect resource id
===================  ==============================================================
``lease.*``          ``prefect-baton.lease.<resource_type>.<resource_id>``
``fence.rejected``   ``prefect-baton.lease.<resource_type>.<resource_id>``
``handoff.*``        ``prefect-baton.handoff.<handoff_id>``
``checkpoint.*``     ``prefect-baton.checkpoint.<subject_id>.<kind>``
``outcome.*``        ``prefect-baton.outcome.<subject_id>``
===================  ==============================================================

with labels ``prefect-baton.org``, ``prefect-baton.principal`` and per kind the ids an
Automation template needs (``prefect-baton.handoff-id``, ``prefect-baton.to-principal``,
``prefect-baton.lease-id``, ``prefect-baton.epoch`` ...); the ledger payload is the event
payload. Inside a run Prefect adds the flow, flow run and task run as related resources.

Two paths deliver them, at least once each, with the same deterministic Prefect event id per
ledger transition (so Prefect's trigger de-duplication sees one event):

- in-run: ``@leased``, :func:`handoff_to` and :func:`accept_handoff` emit the transitions
  they caused right away, with the run as related resource (queued in order for the events
  thread of :mod:`._outbox`, which sends what was queued within 0.1 s in one request, so
  that the run neither waits for Prefect to build them nor pays Prefect's cost per event);
- :func:`relay_events` pages the ledger's event stream from a cursor stored in the ledger
  and emits everything (events written outside runs, renewals, expiries), each with the
  ledger's ``occurred`` time, the label ``prefect-baton.relayed: "true"`` and no related
  resources of the relaying run (only the acting ``principal``). A relayed event can arrive
  long after the fact: an Automation that acts on one must check the current state first
  (see ``flows/resume_expired.py``).

Emission never starts a Prefect server: outside a run and without ``PREFECT_API_URL`` it is
skipped (``emit_event`` would otherwise start an embedded server, or drop the event).
"""

from __future__ import annotations

import contextvars
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from prefect.context import FlowRunContext, TaskRunContext

from prefect_baton._client.sync import Baton
from prefect_baton._ids import random_uuid4_hex
from prefect_baton._rules.events import released_by_handoff
from prefect_baton.metrics._state import record as record_metric
from prefect_baton.models import Handoff, Lease
from prefect_baton.prefect._context import prefect_api_known
from prefect_baton.prefect._outbox import PendingEvent, later

__all__ = [
    "EVENT_PREFIX",
    "RELAY_PRINCIPAL",
    "RelayResult",
    "can_emit",
    "emit_carried_release",
    "emit_handoff_event",
    "emit_lease_event",
    "emit_ledger_event",
    "prefect_event_id",
    "relay_events",
    "resource_for",
]

log = logging.getLogger("prefect_baton.prefect.events")

EVENT_PREFIX = "prefect-baton."
#: Principal whose checkpoint ``(prefect-baton.relay, cursor)`` stores the relay's cursor.
RELAY_PRINCIPAL = "prefect-baton.relay"
_RELAY_SUBJECT = "prefect-baton.relay"
_NS = uuid.UUID("6f1c1f0e-8f5b-4c52-9a39-0b7a2f1d3c11")


def can_emit() -> bool:
    """``True`` inside a Prefect flow or task run, or when ``PREFECT_API_URL`` is set
    (:func:`~prefect_baton.prefect._context.prefect_api_known`).

    Anywhere else ``prefect.events.emit_event`` would start an embedded Prefect server (7-12 s
    here) or silently drop the event, so prefect-baton skips emission instead.
    """
    return prefect_api_known()


def prefect_event_id(
    org: str, kind: str, payload: dict[str, Any], fallback: str | None
) -> uuid.UUID:
    """The deterministic Prefect event id of one ledger transition (``uuid5``).

    Lease events are keyed by ``(kind, lease_id, version)``, handoff events by
    ``(kind, handoff_id)``, checkpoint events by ``(checkpoint_id, version)`` and outcome
    events by ``outcome_id``; anything else by the ledger ``event_id`` (``fallback``; a
    random one when ``None``, drawn only then).
    """
    if kind.startswith("lease.") and "lease_id" in payload:
        key = f"{kind}|{payload['lease_id']}|{payload.get('version')}"
    elif kind.startswith("handoff.") and "handoff_id" in payload:
        key = f"{kind}|{payload['handoff_id']}"
    elif kind.startswith("checkpoint.") and "checkpoint_id" in payload:
        key = f"{kind}|{payload['checkpoint_id']}|{payload.get('version')}"
    elif kind.startswith("outcome.") and "outcome_id" in payload:
        key = f"{kind}|{payload['outcome_id']}"
    else:
        key = f"event|{fallback or random_uuid4_hex()}"
    return uuid.uuid5(_NS, f"{org}|{key}")


def _clip(value: Any) -> str:
    return str(value)[:512]


def resource_for(
    kind: str, subject: str, payload: dict[str, Any], *, org: str, principal: str
) -> dict[str, str]:
    """The Prefect resource (``prefect.resource.id`` plus labels) of a ledger event."""
    labels = {"prefect-baton.org": org, "prefect-baton.principal": principal}
    family = kind.split(".", 1)[0]
    if family in ("lease", "fence"):  # fence.rejected: a refused write under a lease
        rtype = payload.get("resource_type") or subject.split("/", 1)[0]
        rid = payload.get("resource_id") or subject.split("/", 1)[-1]
        res = {
            "prefect.resource.id": f"prefect-baton.lease.{rtype}.{rid}",
            "prefect.resource.name": f"{rtype}/{rid}",
            "prefect-baton.resource-type": _clip(rtype),
            "prefect-baton.resource-id": _clip(rid),
        }
        for k in ("lease_id", "epoch", "owner", "version"):
            if payload.get(k) is not None:
                res[f"prefect-baton.{k.replace('_', '-')}"] = _clip(payload[k])
    elif family == "handoff":
        hid = payload.get("handoff_id", subject)
        res = {
            "prefect.resource.id": f"prefect-baton.handoff.{hid}",
            "prefect.resource.name": f"handoff {subject}",
            "prefect-baton.handoff-id": _clip(hid),
            "prefect-baton.subject": _clip(subject),
        }
        for k in ("from_principal", "to_principal", "lease_id"):
            if payload.get(k) is not None:
                res[f"prefect-baton.{k.replace('_', '-')}"] = _clip(payload[k])
    elif family == "checkpoint":
        res = {
            "prefect.resource.id": f"prefect-baton.checkpoint.{subject}.{payload.get('kind')}",
            "prefect-baton.subject": _clip(subject),
        }
    else:
        res = {
            "prefect.resource.id": f"prefect-baton.{family}.{subject}",
            "prefect-baton.subject": _clip(subject),
        }
    return {**labels, **res}


def emit_ledger_event(
    kind: str,
    subject: str,
    payload: dict[str, Any],
    *,
    org: str,
    principal: str,
    event_id: str | None = None,
    occurred: datetime | None = None,
    relayed: bool = False,
    background: bool = False,
) -> bool:
    """Emit one ledger event as the Prefect event ``prefect-baton.<kind>``.

    Args:
        kind: ledger kind, e.g. ``handoff.created``. subject: the ledger event's subject.
        payload: the ledger payload (JSON object). org, principal: who caused it.
        event_id: the ledger ``event_id`` (fallback for the deterministic id).
        occurred: when it happened (aware ``datetime``; default now).
        relayed: ``True`` for a copy relayed from the ledger by :func:`relay_events`: it gets
            the label ``prefect-baton.relayed`` and none of the current run's related
            resources (the run relaying it did not act; the acting principal is the
            ``principal`` related resource, and ``occurred`` is the ledger's time).
        background: ``True`` to queue it for the events thread (:mod:`._outbox`: sent
            in order, in a batch within about 0.1 s, with the caller's run as related
            resource and ``occurred`` now) instead of handing it to Prefect's events
            worker on the caller's thread.

    Returns:
        ``True`` if handed to Prefect's events worker (or, with ``background``, queued for
        it), ``False`` when skipped (outside a run and without ``PREFECT_API_URL``) or when
        Prefect refused it. Never raises for a delivery problem: events are a mirror of the
        ledger, not its authority.
    """
    if not can_emit():
        return False
    if occurred is None:
        occurred = datetime.now(UTC)
    resource = resource_for(kind, subject, payload, org=org, principal=principal)
    if relayed:
        resource["prefect-baton.relayed"] = "true"

    related = [
        {
            "prefect.resource.id": f"prefect-baton.principal.{principal}",
            "prefect.resource.role": "principal",
        }
    ]
    pending = PendingEvent(
        EVENT_PREFIX + kind,
        resource,
        related,
        payload,
        prefect_event_id(org, kind, payload, event_id),
        occurred,
    )
    if background:
        later(pending)
        return True

    def emit() -> Any:
        if relayed:  # Prefect's events worker attaches the run of the sending context
            cast(Any, FlowRunContext.__var__).set(None)
            cast(Any, TaskRunContext.__var__).set(None)
        return pending.emit_one()

    try:
        ev = contextvars.copy_context().run(emit)
    except Exception:
        log.warning("could not emit Prefect event %s", kind, exc_info=True)
        return False
    return ev is not None


def _lease_payload(lease: Lease) -> dict[str, Any]:
    return {
        "lease_id": lease.lease_id,
        "resource_type": lease.resource_type,
        "resource_id": lease.resource_id,
        "owner": lease.owner,
        "version": lease.version,
        "epoch": lease.epoch,
        "expires_at_ms": round(lease.expires_at.timestamp() * 1000),
    }


def emit_lease_event(b: Baton, kind: str, lease: Lease, **extra: Any) -> bool:
    """Emit ``prefect-baton.<kind>`` for a lease transition ``b`` just made (in-run path, on
    the events thread: see :func:`emit_ledger_event`)."""
    payload = {**_lease_payload(lease), **extra}
    subject = f"{lease.resource_type}/{lease.resource_id}"
    return emit_ledger_event(
        kind, subject, payload, org=b.org, principal=b.principal, background=True
    )


def emit_carried_release(b: Baton, h: Handoff, reason: str) -> bool:
    """Emit ``prefect-baton.lease.released`` for the carried lease that the call which
    returned ``h`` released by ending the handoff unaccepted (``h.released_lease``; ``reason``
    ``handoff_rejected`` or ``handoff_expired``, as the ledger records it), once; ``False``
    when that call released nothing. In-run path, as :func:`emit_lease_event`."""
    if h.released_lease is None:
        return False
    return emit_lease_event(
        b,
        "lease.released",
        h.released_lease,
        status=h.released_lease.status,
        **released_by_handoff(h.handoff_id, reason),
    )


def emit_handoff_event(b: Baton, kind: str, h: Handoff, **extra: Any) -> bool:
    """Emit ``prefect-baton.<kind>`` for a handoff transition ``b`` just made (in-run path, on
    the events thread, after the lease events queued before it)."""
    payload: dict[str, Any] = {
        "handoff_id": h.handoff_id,
        "from_principal": h.from_principal,
        "to_principal": h.to_principal,
        "checkpoint_id": h.checkpoint_id,
        "lease_id": h.lease_id,
        **extra,
    }
    return emit_ledger_event(
        kind, h.subject_id, payload, org=b.org, principal=b.principal, background=True
    )


@dataclass(frozen=True)
class RelayResult:
    """What one :func:`relay_events` call did.

    Attributes:
        emitted: events handed to Prefect (``int``).
        cursor: the ledger ``seq`` relayed up to (``int``).
        skipped: ``True`` when nothing was emitted because emission is not possible here
            (outside a run and without ``PREFECT_API_URL``); the cursor did not move.
    """

    emitted: int
    cursor: int
    skipped: bool = False


def relay_events(
    baton: Baton,
    *,
    after_seq: int | None = None,
    page_size: int = 500,
    max_events: int = 10_000,
) -> RelayResult:
    """Relay the ledger's event stream of ``baton``'s org to Prefect events, at least once.

    The cursor is the checkpoint ``(prefect-baton.relay, cursor)`` of principal
    ``prefect-baton.relay`` in the ledger; it advances only after the events were handed to
    Prefect, so a crash re-emits (with the same event ids, see :func:`prefect_event_id`).

    Args:
        baton: a client of the org to relay (any principal).
        after_seq: start after this ``seq`` instead of the stored cursor (``int`` >= 0).
        page_size: events per ledger read (1..1000). max_events: stop after this many.

    Returns:
        A :class:`RelayResult`. Outside a run and without ``PREFECT_API_URL`` nothing is read
        or emitted (``skipped=True``), and no Prefect server is started.

    Raises:
        UnavailableError: the ledger cannot be reached. ValidationError: bad arguments.
    """
    relay = baton.as_principal(RELAY_PRINCIPAL, baton.role)
    ck = relay.checkpoints.get(_RELAY_SUBJECT, "cursor")
    cursor = int(ck.state.get("seq", 0)) if ck is not None else 0
    if after_seq is not None:
        cursor = after_seq
    if not can_emit():
        return RelayResult(emitted=0, cursor=cursor, skipped=True)
    emitted = 0
    while emitted < max_events:
        page = baton.events.list(after_seq=cursor, limit=max(1, min(page_size, 1000)))
        if not page:
            break
        for ev in page:
            cursor = ev.seq
            if ev.principal == RELAY_PRINCIPAL:
                continue  # the relay's own cursor writes
            emit_ledger_event(
                ev.kind,
                ev.subject,
                ev.payload,
                org=baton.org,
                principal=ev.principal,
                event_id=ev.event_id,
                occurred=ev.occurred_at,
                relayed=True,
            )
            record_metric("baton_events_relayed", baton.org, ev.kind)
            emitted += 1
    if emitted:  # saving the cursor is itself an event: only when something was relayed
        relay.checkpoints.save(_RELAY_SUBJECT, "cursor", {"seq": cursor})
    return RelayResult(emitted=emitted, cursor=cursor)
