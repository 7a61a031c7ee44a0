"""Flow-level handoffs between deployments: :func:`handoff_to` and :func:`accept_handoff`.

The sender records a handoff (optionally with a checkpoint and its lease) and starts the
recipient's deployment with ``handoff_id`` among its parameters; the recipient's run accepts
it, takes over the lease under its own execution key (its flow run id), resumes from the
checkpoint, and from then on the sender's lease generation is stale: the sender's fenced
writes fail with :class:`~prefect_baton.errors.StaleFenceError` (DESIGN.md "Handoffs").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import anyio.to_thread

from prefect_baton._client.keeper import LeaseKeeper
from prefect_baton._client.sync import Baton
from prefect_baton._rules.validation import MAX_ID_LENGTH
from prefect_baton.errors import NotFoundError, UnavailableError, ValidationError
from prefect_baton.models import Checkpoint, Handoff, Lease
from prefect_baton.prefect._context import (
    BatonLike,
    LeaseSlot,
    RunIdentity,
    current_slot,
    resolve_baton,
    run_identity,
)
from prefect_baton.prefect._events import emit_handoff_event
from prefect_baton.prefect._logs import run_logger

__all__ = ["HandoffRejected", "SentHandoff", "ahandoff_to", "handoff_to", "start_recipient"]

HANDOFF_PARAMETER = "handoff_id"
# the handoff_id checked against the recipient's parameter schema before the handoff exists
_UNRECORDED = "hoff_unrecorded"


class HandoffRejected(Exception):
    """Raise inside an :func:`accept_handoff` block, before accepting, to reject the handoff.

    The handoff is resolved ``rejected`` with ``reason`` as its note, the lease it carries
    is released (recorded as ``lease.released``: the sender gave it away and its block has
    usually ended, so nobody would hold it until the TTL), and the block ends without error.
    Raised after acceptance it propagates (an accepted handoff is never turned into a
    rejected one) and the taken-over lease is released.

    Args:
        reason: why (``str``), stored as the handoff's note.
    """

    def __init__(self, reason: str = "rejected by the recipient") -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class SentHandoff:
    """What :func:`handoff_to` did.

    Attributes:
        handoff: the recorded :class:`~prefect_baton.Handoff` (``replayed`` on a retry).
        flow_run: the recipient's Prefect flow run when a deployment was started, else
            ``None``.
    """

    handoff: Handoff
    flow_run: Any = None

    @property
    def handoff_id(self) -> str:
        """The handoff's id (``str``)."""
        return self.handoff.handoff_id


def start_recipient(
    handoff_id: str, deployment: str, parameters: dict[str, Any] | None = None
) -> Any:
    """Start ``deployment`` for a handoff, once.

    Args:
        handoff_id: passed as the ``handoff_id`` parameter and used as Prefect's
            idempotency key, so a retried call returns the same flow run.
        deployment: ``"<flow name>/<deployment name>"``.
        parameters: more parameters for the run; for a flow taking ``**kwargs`` the
            names it does not declare are packed into that parameter
            (:func:`recipient_run_parameters`), so the flow receives them as keyword
            arguments.

    Returns:
        The created ``prefect.client.schemas.objects.FlowRun`` (not awaited: ``timeout=0``).

    Raises:
        NotFoundError: no such deployment (``deployment '<name>' not found``, as
        :func:`handoff_to` says). ValidationError: not of the form
        ``"<flow>/<deployment>"``; the deployment refused the parameters
        (Prefect's 409: its flow requires one not given, or a given one is invalid; the
        message names the deployment, the parameters given and Prefect's reason).
        UnavailableError: the Prefect API cannot be reached or answered a 5xx
        (:func:`raise_if_unavailable`). ValueError and other Prefect errors: what
        Prefect's ``run_deployment`` raises.
    """
    params = recipient_run_parameters(handoff_id, deployment, parameters)
    return start_deployment(deployment, params, idempotency_key=handoff_id)


def recipient_parameters(handoff_id: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """The parameters a handoff's recipient run is started with: ``parameters`` (a JSON
    object, or ``None``) plus ``handoff_id`` (``str``) under the name ``handoff_id``."""
    return {**(parameters or {}), HANDOFF_PARAMETER: handoff_id}


def recipient_run_parameters(
    handoff_id: str, deployment: str, parameters: dict[str, Any] | None
) -> dict[str, Any]:
    """The parameters of the run :func:`start_recipient` starts for a handoff
    (``dict``): :func:`recipient_parameters` shaped for the flow of ``deployment``
    (``"<flow name>/<deployment name>"``) by :func:`shape_parameters`, so a flow taking
    ``**kwargs`` receives the names it does not declare as keyword arguments. Give them
    to ``prefect deployment run <deployment> --params '<JSON>'`` to start it by hand.

    Raises:
        ValidationError: not of the form ``"<flow>/<deployment>"``; a name given both
            at the top and in the ``**kwargs`` parameter's dict with different values.
        NotFoundError: no such deployment.
        UnavailableError: the Prefect API cannot be reached or answered a 5xx.
    """
    found = read_deployment(deployment)
    return shape_parameters(
        found.parameter_openapi_schema, recipient_parameters(handoff_id, parameters)
    )


def start_deployment(deployment: str, parameters: dict[str, Any], *, idempotency_key: str) -> Any:
    """Start a run of ``deployment`` (``"<flow name>/<deployment name>"``) with
    ``parameters``, without waiting for it (Prefect ``run_deployment``, ``timeout=0``);
    ``idempotency_key`` makes a repeated call return the same flow run.

    Returns:
        The created ``prefect.client.schemas.objects.FlowRun``.

    Raises:
        NotFoundError: no such deployment. ValidationError: the deployment's parameter
            schema refused ``parameters`` (Prefect answered 409, e.g. ``'table' is a
            required property``); the message names the deployment, the parameters given
            and Prefect's reason (:func:`parameters_refused`). UnavailableError: the
            Prefect API cannot be reached (a transport error) or answered a 5xx
            (:func:`raise_if_unavailable`); called by :func:`handoff_to` after the
            handoff is recorded, the handoff then stays recorded and pending, and
            ``flows/dispatch_handoffs.py`` can start its recipient once the API is back
            (the idempotency key keeps it to one run). Other Prefect errors as
            ``run_deployment`` raises them.
    """
    import httpx
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError

    try:
        return run_deployment(
            deployment,
            parameters=parameters,
            timeout=0,
            idempotency_key=idempotency_key,
            as_subflow=False,
        )
    except ObjectNotFound:
        raise deployment_not_found(deployment) from None
    except PrefectHTTPStatusError as exc:
        if exc.response.status_code != 409:
            raise_if_unavailable(exc)
            raise
        try:
            reason = str(exc.response.json().get("detail", exc.response.text))
        except ValueError:
            reason = exc.response.text
        raise parameters_refused(deployment, parameters, reason) from None
    except httpx.HTTPError as exc:
        raise_if_unavailable(exc)
        raise


def raise_if_unavailable(exc: Exception) -> None:
    """Raise :class:`~prefect_baton.errors.UnavailableError` (from ``exc``) when a Prefect
    API call failed with ``exc`` because the API is unavailable: a transport error
    (``httpx.HTTPError`` other than a status error: connection refused, timeout, ...) or an
    answer with a 5xx status. The message names the API URL (``PREFECT_API_URL``; unset:
    Prefect's ephemeral server) and the cause. Returns for any other error (a 4xx answer is
    the caller's to explain)."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    if isinstance(exc, httpx.HTTPStatusError):
        if exc.response.status_code < 500:
            return
        cause = f"it answered HTTP {exc.response.status_code}"
    elif isinstance(exc, httpx.HTTPError):
        cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    else:
        return
    url = PREFECT_API_URL.value()
    where = f"the Prefect API at {url}" if url else "Prefect's ephemeral API server"
    raise UnavailableError(f"{where} is unavailable ({cause})") from exc


def parameters_refused(deployment: str, parameters: dict[str, Any], reason: str) -> ValidationError:
    """The error for a deployment whose parameter schema refuses ``parameters`` (the run's
    parameters, ``dict``) for ``reason`` (Prefect's, ``str``): it names the deployment, the
    parameters' names and the reason."""
    given = ", ".join(sorted(parameters)) or "none"
    return ValidationError(
        f"deployment {deployment!r} refused the parameters of its run ({given}): "
        f"{reason.rstrip('.')}. Its flow must take these parameters and require no other "
        "(see docs/prefect.md)"
    )


def deployment_not_found(deployment: str) -> NotFoundError:
    """The error for a deployment name the Prefect API does not know."""
    return NotFoundError(f"deployment {deployment!r} not found")


def check_deployment(deployment: str, parameters: dict[str, Any] | None = None) -> None:
    """Make sure ``deployment`` (``"<flow name>/<deployment name>"``) exists on the Prefect
    API, and would take a run with ``parameters``, before anything is recorded for it.

    ``parameters`` (the run's parameters, ``dict``; ``None``: not checked) are checked as
    Prefect's server checks them when it creates a run of the deployment: only when the
    deployment has ``enforce_parameter_schema`` on, merged over the deployment's default
    parameters, with Prefect's ``prefect.utilities.schema_tools.validate`` against its
    parameter schema. Defaults that the server fills in at run creation (workspace
    variables, templates) and schemas Prefect cannot check (circular references) are left
    to the server: :func:`start_deployment` still turns its refusal into the same error.
    Under the same condition a parameter name that is no property of the schema is refused
    (Prefect's schema lets it through, and the run would crash with
    ``SignatureMismatchError`` without resolving its handoff), unless the flow takes
    ``**kwargs``: the parameters are checked as :func:`shape_parameters` packs them into
    it, as :func:`start_recipient` starts the run.

    Raises:
        ValidationError: not of the form ``"<flow>/<deployment>"``; the deployment's
            parameter schema refuses ``parameters`` (:func:`parameters_refused`, the
            message :func:`start_deployment` gives for Prefect's 409), or its flow takes
            no parameter of a given name (the reason names them, and says the recipient
            of a handoff must take ``handoff_id`` when that is one); a name given both
            at the top and in the ``**kwargs`` parameter's dict with different values.
        NotFoundError: no such deployment (a typo).
        UnavailableError: the Prefect API cannot be reached or answered a 5xx
            (:func:`raise_if_unavailable`).
        In each case nothing was recorded, and a lease the caller holds stays with it.
    """
    found = read_deployment(deployment)
    if parameters is None:
        return
    shaped = shape_parameters(found.parameter_openapi_schema, parameters)
    if found.enforce_parameter_schema:
        _check_parameters(deployment, found, parameters, shaped)


def read_deployment(deployment: str) -> Any:
    """The Prefect deployment ``deployment`` (``"<flow name>/<deployment name>"``), a
    ``prefect.client.schemas.responses.DeploymentResponse``.

    Raises:
        ValidationError: not of the form ``"<flow>/<deployment>"``.
        NotFoundError: no such deployment (:func:`deployment_not_found`).
        UnavailableError: the Prefect API cannot be reached or answered a 5xx
            (:func:`raise_if_unavailable`).
    """
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    flow_name, _, name = deployment.partition("/")
    if not flow_name or not name:
        raise ValidationError(
            f"deployment must be '<flow name>/<deployment name>', got {deployment!r}"
        )
    try:
        with get_client(sync_client=True) as client:
            return client.read_deployment_by_name(deployment)
    except ObjectNotFound:
        raise deployment_not_found(deployment) from None
    except httpx.HTTPError as exc:
        raise_if_unavailable(exc)
        raise


def shape_parameters(schema: Any, parameters: dict[str, Any]) -> dict[str, Any]:
    """``parameters`` (a run's parameters, ``dict``) as the flow of a deployment with
    parameter schema ``schema`` takes them (a new ``dict``; ``parameters`` when nothing
    changes).

    Prefect calls a flow with the names of its signature only
    (``prefect.utilities.callables.parameters_to_args_kwargs``): a ``**kwargs`` parameter
    is one parameter named like it (e.g. ``kwargs``) holding a dict of the extra keyword
    arguments, and any other name crashes the run with ``SignatureMismatchError``. So when
    the schema shows a ``**kwargs`` parameter (:func:`_kwargs_parameter`), every name that
    is no property of the schema moves into that parameter's dict, merged with a dict the
    caller gave under its name: the flow receives them as keyword arguments. Without one,
    or when that parameter holds no dict, the parameters stay as given (the check refuses
    unknown names).

    Raises:
        ValidationError: a name given both at the top and in the ``**kwargs``
            parameter's dict, with different values.
    """
    catch_all = _kwargs_parameter(schema)
    if catch_all is None:
        return parameters
    declared: dict[str, Any] = schema["properties"]
    extra = {k: v for k, v in parameters.items() if k not in declared}
    given = parameters.get(catch_all, {})
    if not extra or not isinstance(given, dict):
        return parameters
    twice = sorted(k for k in extra if k in given and given[k] != extra[k])
    if twice:
        names = ", ".join(repr(k) for k in twice)
        raise ValidationError(
            f"parameters {names} are given both by name and in {catch_all!r} (the flow's "
            "**kwargs) with different values: give each once"
        )
    kept = {k: v for k, v in parameters.items() if k in declared}
    return {**kept, catch_all: {**given, **extra}}


def _check_parameters(
    deployment: str, found: Any, parameters: dict[str, Any], shaped: dict[str, Any]
) -> None:
    """What Prefect's server does with a run's parameters before creating it
    (``create_flow_run_from_deployment`` in ``prefect.server.api.deployments``), and what
    the flow's run does with them: a name the flow does not take is refused too (Prefect's
    schema allows any extra property, and the run would crash with
    ``SignatureMismatchError``); a flow taking ``**kwargs`` takes them packed into it
    (``shaped``, :func:`shape_parameters`). The refusal names ``parameters`` (as the caller
    gave them) and gives every reason found."""
    unknown = _unknown_parameters(found.parameter_openapi_schema, shaped)
    reasons = [_schema_refusal(found, shaped), _unknown_reason(unknown) if unknown else None]
    if any(reasons):
        raise parameters_refused(deployment, parameters, "; ".join(r for r in reasons if r))


def _schema_refusal(found: Any, parameters: dict[str, Any]) -> str | None:
    """Why Prefect's server would refuse ``parameters`` for the deployment ``found``
    (``str``), or ``None`` when it would take them or only the server can tell."""
    from prefect.utilities.schema_tools import CircularSchemaRefError, hydrate, validate
    from prefect.utilities.schema_tools import ValidationError as SchemaRefused
    from pydantic_core import PydanticSerializationError, to_jsonable_python

    try:  # as Prefect's client sends them (a tuple as a list, ...)
        sent = to_jsonable_python(parameters)
    except PydanticSerializationError:
        return None  # not JSON: the ledger or Prefect's client refuses them
    merged = {**found.parameters, **sent}
    if hydrate(merged) != merged:
        return None  # defaults the server renders (workspace variables, templates): its call
    schema = found.parameter_openapi_schema
    if not isinstance(schema, dict):
        return (
            "parameter schema enforcement is enabled and the deployment does not have a "
            "valid parameter schema"
        )
    try:
        validate(merged, schema, raise_on_error=True)
    except SchemaRefused as exc:
        return str(exc).rstrip(".")
    except CircularSchemaRefError:
        return None  # the server answers 422 for it
    return None


def _unknown_parameters(schema: Any, parameters: dict[str, Any]) -> list[str]:
    """The names in ``parameters`` that the flow of a deployment with parameter schema
    ``schema`` does not take (sorted). None when the schema is no JSON object with
    ``properties`` (left to Prefect). ``parameters`` are shaped already
    (:func:`shape_parameters`): a flow taking ``**kwargs`` gets its extra names packed
    into that parameter, so none is left over."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return []
    properties: dict[str, Any] = schema["properties"]
    return sorted(set(parameters) - set(properties))


def _kwargs_parameter(schema: Any) -> str | None:
    """The name of the ``**kwargs`` parameter of the flow whose parameter schema is
    ``schema`` (``str``), or ``None`` when it has none (or the schema is no JSON object
    with ``properties``). Prefect's ``parameter_schema`` renders ``**kwargs`` as the last
    property (highest ``position``) of type ``object`` defaulting to ``{}`` that allows
    more properties. A last argument ``kw: dict = {}`` reads the same: such a flow gets
    the extra names in ``kw``, as a dict, rather than crashing."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return None
    properties: dict[str, Any] = schema["properties"]
    if not properties:
        return None
    order = list(properties)

    def position(name: str) -> int:
        prop = properties[name]
        at = prop.get("position") if isinstance(prop, dict) else None
        return at if isinstance(at, int) else order.index(name)

    last = max(order, key=position)
    return last if _stands_for_kwargs(properties[last]) else None


def _stands_for_kwargs(prop: Any) -> bool:
    """Whether a parameter schema's property is how Prefect renders ``**kwargs``."""
    return (
        isinstance(prop, dict)
        and prop.get("type") == "object"
        and prop.get("default") == {}
        and prop.get("additionalProperties", True) is not False
    )


def _unknown_reason(unknown: list[str]) -> str:
    """Why a recipient deployment refuses the parameter names ``unknown`` (``str``)."""
    names = ", ".join(repr(n) for n in unknown)
    reason = f"its flow takes no parameter {names} (and no **kwargs)"
    if HANDOFF_PARAMETER in unknown:
        reason += (
            f"; the recipient flow of a handoff must take a {HANDOFF_PARAMETER!r} parameter"
            " (e.g. `def flow(..., handoff_id: str)`)"
        )
    return reason


def _client_for(
    baton: BatonLike | None, ident: RunIdentity, slot: LeaseSlot | None, principal: str | None
) -> Baton:
    if baton is None and slot is not None and principal in (None, slot.baton.principal):
        return slot.baton
    return resolve_baton(baton, ident.principal, principal)


def default_handoff_key(
    execution_key: str, to: str, subject_id: str, lease: LeaseKeeper | Lease | None
) -> str:
    """The idempotency key :func:`handoff_to` gives a handoff inside a run (``str``):
    ``"<execution key>:handoff:<recipient>:<subject_id>"``, then ``":<lease id>"`` when it
    carries a lease.

    A Prefect retry that carries the same lease (the handoff is still pending, so the retry
    replayed the lease) replays the same handoff. One that carries a new lease (the first
    handoff was rejected or expired, which released its lease, and the retry acquired the
    resource anew) sends a new handoff instead of failing with ``IDEMPOTENCY_MISMATCH``
    against the ended one. A key over the 256-character limit of ids keeps its execution
    key and ends with the SHA-256 of the rest.
    """
    rest = f"{to}:{subject_id}"
    if lease is not None:
        held = lease.lease if isinstance(lease, LeaseKeeper) else lease
        rest += f":{held.lease_id}"
    key = f"{execution_key}:handoff:{rest}"
    if len(key) > MAX_ID_LENGTH:
        key = f"{execution_key}:handoff:sha256:{hashlib.sha256(rest.encode()).hexdigest()}"
    return key


def handoff_to(
    principal: str | None,
    subject_id: str,
    *,
    checkpoint: dict[str, Any] | Checkpoint | str | None = None,
    message: str | None = None,
    lease: LeaseKeeper | Lease | None = None,
    deployment: str | None = None,
    parameters: dict[str, Any] | None = None,
    baton: BatonLike | None = None,
    idempotency_key: str | None = None,
    checkpoint_kind: str = "handoff",
    expires_in_seconds: int | None = None,
    from_principal: str | None = None,
) -> SentHandoff:
    """Hand ``subject_id`` to ``principal`` and, with ``deployment``, start its run.

    Args:
        principal: the recipient (``str``); ``None`` with ``deployment`` given means the
            deployment's name, which is the principal its runs act as by default.
        subject_id: what is handed over (``str``).
        checkpoint: resumable state for the recipient: a JSON object (saved now as the
            checkpoint ``(subject_id, checkpoint_kind)``, fenced by ``lease``), a
            :class:`Checkpoint`, or a checkpoint id.
        message: a note for the recipient.
        lease: a lease you hold (typically ``current_lease()``); accepting the handoff
            transfers it to the recipient. A lease block (``current_lease()``) then rides on
            the handoff, as with ``handoffs.create(..., lease=held)``: it is no longer
            released when your block ends (it stays held, unrenewed after the block, until
            the recipient accepts, the handoff is rejected or expires, which releases it,
            or its TTL runs out: choose a TTL longer than the recipient's start-up).
        deployment: the recipient's deployment ``"<flow>/<deployment>"``; checked first
            (an unknown one, or one whose parameter schema refuses the run's parameters,
            raises before anything is recorded, see :func:`check_deployment`), then started with
            ``handoff_id`` among its parameters and the handoff id as Prefect idempotency
            key, so a retried call starts one run only.
        parameters: more parameters for the recipient's run (a JSON object); stored with
            the handoff (``Handoff.parameters``), so ``dispatch_handoffs`` passes them on
            too.
        baton: client, factory or ``"baton/<block name>"`` (see :func:`leased`); default:
            the enclosing lease's client, else ``Baton.from_settings()`` acting as the run's
            principal.
        idempotency_key: for the handoff record; default inside a run
            :func:`default_handoff_key` (``"<execution key>:handoff:<principal>:<subject_id>"``
            and the carried lease's id), so a Prefect retry carrying the same lease replays
            the same handoff (and starts the same run), and one that acquired anew after a
            rejection sends a new handoff.
        checkpoint_kind: the kind of a checkpoint saved from a dict (default ``handoff``).
        expires_in_seconds: the handoff reads ``expired`` after this long.
        from_principal: the principal to send as (``str``; default: the enclosing lease's,
            else the run's principal, see :func:`leased`). Sending with ``lease=`` needs the
            principal that holds that lease.

    Returns:
        :class:`SentHandoff` with the handoff and the started flow run.

    Raises:
        ValidationError: no recipient, a handoff to yourself, bad ids, a deployment name
        without ``/``; the deployment's parameter schema refuses ``parameters`` plus
        ``handoff_id`` (e.g. its flow requires a parameter not given, or takes no
        parameter of a given name, ``handoff_id`` included, and no ``**kwargs``), checked
        as Prefect checks them, before anything is recorded: no handoff, and the lease
        stays with your block. LeaseLostError: the lease is not held. StaleFenceError: the
        checkpoint save's fence is stale. NotFoundError: unknown checkpoint; unknown
        deployment (checked before anything is recorded: the lease stays with your block).
        UnavailableError: the Prefect API cannot be reached or answered a 5xx, naming its
        URL: at the check, nothing is recorded and the lease stays with your block; at the
        start, as below. Prefect errors from starting the deployment, UnavailableError, and
        ValidationError when Prefect refused the parameters at the start all the same (see
        :func:`start_recipient`; e.g. the deployment changed since the check): the handoff
        stays recorded and pending; ``dispatch_handoffs`` can start it later.
    """
    to = principal or deployment
    if not to:
        raise ValidationError("handoff_to needs a principal or a deployment")
    if deployment is not None:
        check_deployment(deployment, recipient_parameters(_UNRECORDED, parameters))
    ident = run_identity()
    slot = current_slot()
    b = _client_for(baton, ident, slot, from_principal)
    key = idempotency_key
    if key is None and ident.in_run:
        key = default_handoff_key(ident.execution_key, to, subject_id, lease)
    ck_id: str | None
    if isinstance(checkpoint, dict):
        ck_id = b.checkpoints.save(
            subject_id, checkpoint_kind, checkpoint, fence=lease
        ).checkpoint_id
    elif isinstance(checkpoint, Checkpoint):
        ck_id = checkpoint.checkpoint_id
    else:
        ck_id = checkpoint
    handoff = b.handoffs.create(
        to,
        subject_id,
        checkpoint_id=ck_id,
        message=message,
        lease=lease,
        idempotency_key=key,
        expires_in_seconds=expires_in_seconds,
        parameters=parameters,
    )
    # A lease block given as lease= now rides on the handoff (LeaseKeeper.attach_handoff,
    # done by handoffs.create): its exit leaves the lease to the recipient.
    if not handoff.replayed:
        emit_handoff_event(b, "handoff.created", handoff)
        run_logger().info(
            "handoff %s of %s sent from %s to %s%s",
            handoff.handoff_id,
            subject_id,
            b.principal,
            to,
            " with its lease" if handoff.lease_id else "",
        )
    flow_run = None
    if deployment is not None:
        flow_run = start_recipient(handoff.handoff_id, deployment, parameters)
    return SentHandoff(handoff=handoff, flow_run=flow_run)


async def ahandoff_to(principal: str | None, subject_id: str, **kwargs: Any) -> SentHandoff:
    """:func:`handoff_to` for async code (the ledger calls run on a worker thread)."""
    return await anyio.to_thread.run_sync(lambda: handoff_to(principal, subject_id, **kwargs))
