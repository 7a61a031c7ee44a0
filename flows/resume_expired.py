"""Deployable flow ``baton-resume-expired``: the resume pattern for ``lease.expired``.

An Automation on ``prefect-baton.lease.expired`` can run this flow with the event's payload
(``resource_type``, ``resource_id``, ``lease_id``, ``epoch``, ``reason``). Events arrive at
least once and possibly late (the relay re-sends from its cursor, an Automation may fire
again), so the flow never trusts the event alone. It resumes only when all of these hold
*now*:

- the event's ``reason`` is ``lapsed`` (found free); ``taken_over`` means another holder
  already has the resource;
- nobody holds the resource and its epoch is still the expired lease's: a higher epoch means
  someone took it over since (and may have finished);
- the subject (``subject_id``, default ``"<resource_type>/<resource_id>"``) has no
  ``succeeded`` outcome.

Then it starts ``deployment`` with ``resource_type``, ``resource_id``, ``subject_id`` and
``expired_lease_id`` (all ``str``: the resume deployment's flow must take these four and
require no other, else the run fails with a ValidationError naming the deployment and
Prefect's reason), with ``resume:<lease_id>`` as Prefect idempotency key: however often the
event is delivered, one expired generation starts at most one resume run. Otherwise it exits,
saying why (``skipped``), without redoing finished work.

Run once: ``python flows/resume_expired.py RESOURCE_TYPE RESOURCE_ID EPOCH LEASE_ID
[--reason lapsed] [--subject-id S] [--deployment FLOW/DEPLOYMENT]``; serve it (without a
schedule, for an Automation to run with the event's payload): ``python
flows/resume_expired.py --serve --deployment FLOW/DEPLOYMENT``.
"""

from __future__ import annotations

import os
from argparse import ArgumentParser, Namespace
from typing import Any

# Prefect's temporary server must not send telemetry off this machine (set before
# Prefect is imported; an explicit setting wins).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, get_run_logger

from prefect_baton import Baton, ValidationError
from prefect_baton._rules.events import EXPIRY_LAPSED, EXPIRY_TAKEN_OVER
from prefect_baton.prefect._handoff import start_deployment
from prefect_baton.prefect._logs import expected_errors
from prefect_baton.prefect._serve import flow_main, reading_baton

RESUMER = "prefect-baton.resume-expired"


def resume_verdict(
    b: Baton,
    resource_type: str,
    resource_id: str,
    epoch: int,
    *,
    reason: str = "lapsed",
    subject_id: str | None = None,
) -> str | None:
    """Why not to resume now (``str``), or ``None`` when resuming is right.

    Args:
        b: a client of the org (any principal: ``inspect`` and outcomes are org-wide).
        resource_type, resource_id: the expired lease's resource.
        epoch: the expired lease's epoch (``int``, from the event payload).
        reason: the event's ``reason`` (``lapsed`` or ``taken_over``).
        subject_id: whose outcomes say the work is done (default the resource).

    Raises:
        ValidationError: ``reason`` is neither ``lapsed`` nor ``taken_over``.
        UnavailableError: the ledger cannot be reached.
    """
    if reason not in (EXPIRY_LAPSED, EXPIRY_TAKEN_OVER):
        raise ValidationError(
            f"reason must be {EXPIRY_LAPSED!r} or {EXPIRY_TAKEN_OVER!r} (the lease.expired "
            f"event's reason), got {reason!r}"
        )
    if reason == EXPIRY_TAKEN_OVER:
        return "the lease was taken over: another holder has the resource"
    info = b.leases.inspect(resource_type, resource_id)
    if info.held:
        return f"the resource is held again (epoch {info.epoch})"
    if info.epoch > epoch:
        return f"the resource moved on to epoch {info.epoch} (the event is for epoch {epoch})"
    subject = subject_id or f"{resource_type}/{resource_id}"
    if any(o.status == "succeeded" for o in b.outcomes.list(subject)):
        return f"{subject} already has a succeeded outcome"
    return None


@flow(name="baton-resume-expired", persist_result=True)
def resume_expired(
    resource_type: str,
    resource_id: str,
    epoch: int,
    lease_id: str,
    reason: str = "lapsed",
    subject_id: str | None = None,
    deployment: str | None = None,
) -> dict[str, Any]:
    """Resume the work of an expired lease once, if it is still unfinished and free.

    Args:
        resource_type, resource_id, epoch, lease_id, reason: from the ``lease.expired``
            event's payload.
        subject_id: the subject whose outcomes tell finished work (default the resource).
        deployment: ``"<flow>/<deployment>"`` to start for the resume; ``None`` only
            reports the verdict.

    Returns:
        ``{"status": "skipped", "reason": str}``, ``{"status": "resumable"}`` (no
        deployment given) or ``{"status": "started", "flow_run_id": str}``.

    Raises:
        UnavailableError: the ledger cannot be reached, or the Prefect API (unreachable
        or a 5xx; the message names its URL). NotFoundError: no such ``deployment``; no
        ledger file at a SQLite ``BATON_LEDGER_URL`` (none is created).
        ValidationError: ``deployment`` refused the four parameters (its flow must take
        ``resource_type``, ``resource_id``, ``subject_id`` and ``expired_lease_id`` and
        require no other). Other Prefect errors from starting it.
    """
    with expected_errors():
        log = get_run_logger()
        b = reading_baton(principal=RESUMER)
        why = resume_verdict(
            b, resource_type, resource_id, epoch, reason=reason, subject_id=subject_id
        )
        if why is not None:
            log.info("not resuming %s/%s: %s", resource_type, resource_id, why)
            return {"status": "skipped", "reason": why}
        if deployment is None:
            return {"status": "resumable"}
        run = start_deployment(
            deployment,
            {
                "resource_type": resource_type,
                "resource_id": resource_id,
                "subject_id": subject_id or f"{resource_type}/{resource_id}",
                "expired_lease_id": lease_id,
            },
            idempotency_key=f"resume:{lease_id}",
        )
        log.info("resuming %s/%s in flow run %s", resource_type, resource_id, run.id)
        return {"status": "started", "flow_run_id": str(run.id)}


_EVENT = ("resource_type", "resource_id", "epoch", "lease_id")


def _arguments(parser: ArgumentParser) -> None:
    for field in _EVENT:
        parser.add_argument(
            field,
            nargs="?",
            type=int if field == "epoch" else str,
            metavar=field.upper(),
            help=f"the lease.expired event's {field} (run once; not with --serve)",
        )
    parser.add_argument(
        "--reason",
        default=EXPIRY_LAPSED,
        choices=(EXPIRY_LAPSED, EXPIRY_TAKEN_OVER),
        help="the event's reason (run once)",
    )
    parser.add_argument("--subject-id", help="subject whose outcomes tell finished work")
    parser.add_argument(
        "--deployment",
        help="FLOW/DEPLOYMENT to start for the resume (with --serve: the served "
        "deployment's default); without it the flow only reports its verdict",
    )


def _parameters(ns: Namespace, parser: ArgumentParser) -> dict[str, Any]:
    given = {field: getattr(ns, field) for field in _EVENT if getattr(ns, field) is not None}
    if ns.serve:
        if given:
            parser.error("--serve takes no event arguments: the Automation passes them")
        return {"deployment": ns.deployment} if ns.deployment else {}
    if len(given) < len(_EVENT):
        parser.error("give RESOURCE_TYPE RESOURCE_ID EPOCH LEASE_ID, or --serve")
    return {
        **given,
        "reason": ns.reason,
        "subject_id": ns.subject_id,
        "deployment": ns.deployment,
    }


def main(argv: list[str] | None = None) -> Any:
    """Run the flow once for one event, or serve it (``--serve``); see the module doc."""
    return flow_main(
        resume_expired,
        name="resume-expired",
        doc=__doc__,
        argv=argv,
        arguments=_arguments,
        parameters=_parameters,
    )


if __name__ == "__main__":
    main()
