"""Run identity and the current lease.

Inside a Prefect run the identity that prefect-baton acts under is derived from the run:

- principal: ``BATON_PREFECT_PRINCIPAL`` when set; else the deployment's full name
  ``"<flow name>/<deployment name>"`` (the string :func:`prefect.deployments.run_deployment`
  takes) when the flow run came from a deployment, else the flow's name (a task run outside
  any flow: the task's name). ``principal=`` on ``@leased``, ``lease``, ``accept_handoff``
  (``from_principal=`` on ``handoff_to``) and the ``principal`` of a ``BatonBlock`` named by
  ``baton="baton/<name>"`` choose another (see :func:`resolve_baton`);
- execution key: the task run id for tasks, the flow run id for flows. A Prefect retry keeps
  the run id, so a retried run *replays* its own acquire instead of conflicting with itself,
  while a different run of the same deployment conflicts (DESIGN.md "Leases": a different
  execution key conflicts even for the same principal).

Outside any run the principal comes from ``BATON_PRINCIPAL`` (:class:`BatonSettings`) and each
call gets a fresh random execution key.
"""

from __future__ import annotations

import contextvars
import inspect
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from prefect.context import FlowRunContext, TaskRunContext

from prefect_baton._client.aio import AsyncBaton
from prefect_baton._client.keeper import LeaseKeeper
from prefect_baton._client.sync import Baton
from prefect_baton._settings import BatonSettings, load_settings
from prefect_baton.errors import NotFoundError, ValidationError

__all__ = [
    "BLOCK_PREFIX",
    "BatonLike",
    "RunIdentity",
    "check_baton",
    "current_baton",
    "current_lease",
    "resolve_baton",
    "retry_follows",
    "run_identity",
]

RunKind = Literal["task", "flow", "none"]

#: What ``baton=`` accepts: a client, a factory called with the run's principal, or
#: ``"baton/<block name>"``, a saved :class:`~prefect_baton.prefect.BatonBlock`.
BatonLike = Baton | AsyncBaton | Callable[[str], Baton] | str

#: The prefix of ``baton="baton/<block name>"`` (the Block type's slug).
BLOCK_PREFIX = "baton/"


#: The variables :class:`BatonSettings` reads (``BATON_<FIELD>``).
_SETTINGS_VARS = tuple(f"BATON_{name.upper()}" for name in BatonSettings.model_fields)
#: The same, as the keys of ``os.environ``'s underlying mapping (``os.fsencode``d).
_SETTINGS_KEYS = tuple(os.fsencode(name) for name in _SETTINGS_VARS)


def _settings_key() -> tuple[Any, ...]:
    """The current values of :data:`_SETTINGS_VARS`: read from ``os.environ``'s underlying
    bytes mapping where it has one (CPython on POSIX; ``os.environ.get`` encodes the name and
    decodes the value of each, 17 lookups costing about 0.1 ms per call in a run)."""
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict) and os.name == "posix":
        return tuple(map(data.get, _SETTINGS_KEYS))
    environ = os.environ
    return tuple(environ.get(name) for name in _SETTINGS_VARS)


def _settings() -> BatonSettings:
    """The ``BATON_*`` settings, read once per distinct value of the variables they are
    read from (reading them costs about 0.7 ms, more than the rest of a lease on Redis;
    looking the variables up, not scanning the whole environment, keeps the check cheap).

    Raises:
        ValidationError: a bad ``BATON_*`` variable.
    """
    key = _settings_key()
    found = _settings_cache.get(key)
    if found is None:
        found = load_settings()
        with _clients_lock:
            if len(_settings_cache) > 64:
                _settings_cache.clear()
            _settings_cache[key] = found
    return found


_settings_cache: dict[tuple[str | None, ...], BatonSettings] = {}


@dataclass(frozen=True)
class RunIdentity:
    """Who is acting, as derived from the Prefect run context (no I/O but a cached
    deployment-name lookup).

    Attributes:
        kind: ``"task"``, ``"flow"`` or ``"none"`` (outside any run).
        principal: default principal (``str``), see the module docstring.
        execution_key: task run id, flow run id, or a random key outside a run (``str``).
        run_count: the run's attempt number, 1 on the first try (``int``; 1 outside a run).
        retries: how many retries the task or flow allows (``int``; 0 outside a run).
        flow_run_id, task_run_id: the run ids as strings, or ``None``.
        flow_name, deployment_name: names, or ``None``.
        retry_condition: the task's ``retry_condition_fn`` (``None`` for flows).
        task: the Prefect task object (for ``retry_condition_fn``), or ``None``.
        task_run: the Prefect task run object, or ``None``.
    """

    kind: RunKind
    principal: str
    execution_key: str
    run_count: int = 1
    retries: int = 0
    flow_run_id: str | None = None
    task_run_id: str | None = None
    flow_name: str | None = None
    deployment_name: str | None = None
    retry_condition: Callable[..., Any] | None = field(default=None, repr=False)
    task: Any = field(default=None, repr=False)
    task_run: Any = field(default=None, repr=False)

    @property
    def in_run(self) -> bool:
        """``True`` inside a Prefect task or flow run."""
        return self.kind != "none"

    @property
    def retries_left(self) -> int:
        """Retries Prefect still allows after the current attempt (``int``, >= 0)."""
        return max(0, self.retries - (self.run_count - 1))


_deployment_names: dict[str, str | None] = {}
_deployment_lock = threading.Lock()


def _deployment_full_name(deployment_id: Any, flow_name: str) -> str | None:
    """``"<flow>/<deployment>"`` for a deployment id, read once per process from the API."""
    key = str(deployment_id)
    with _deployment_lock:
        if key in _deployment_names:
            return _deployment_names[key]
    name: str | None = None
    try:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            name = f"{flow_name}/{client.read_deployment(deployment_id).name}"
    except Exception:  # the API is unreachable: fall back to the flow name
        name = None
    with _deployment_lock:
        _deployment_names[key] = name
    return name


def run_identity(prefer: RunKind | None = None) -> RunIdentity:
    """The identity of the current Prefect run (see the module docstring).

    Args:
        prefer: ``"flow"`` to describe the flow run even when called inside a task run (used
            for ``@leased`` flows), ``"task"``/``None`` to prefer the innermost task run.

    Returns:
        A :class:`RunIdentity`; ``kind == "none"`` outside any run, with the principal from
        ``BATON_PRINCIPAL`` and a fresh random execution key.

    Raises:
        ValidationError: a bad ``BATON_*`` variable.
    """
    flow_ctx = FlowRunContext.get()
    task_ctx = TaskRunContext.get()
    flow_name = deployment = None
    principal: str | None = None
    if flow_ctx is not None or task_ctx is not None:
        principal = _settings().prefect_principal
    if flow_ctx is not None and flow_ctx.flow_run is not None:
        flow_name = flow_ctx.flow.name if flow_ctx.flow is not None else flow_ctx.flow_run.name
        dep_id = flow_ctx.flow_run.deployment_id
        if dep_id is not None:
            deployment = _deployment_full_name(dep_id, flow_name)
        principal = principal or deployment or flow_name
    use_task = task_ctx is not None and prefer != "flow"
    if use_task and task_ctx is not None and flow_ctx is not None and flow_ctx.flow_run:
        # a flow called inside a task: the flow run is the inner one
        use_task = task_ctx.task_run.flow_run_id == flow_ctx.flow_run.id
    if use_task and task_ctx is not None:
        tr = task_ctx.task_run
        return RunIdentity(
            kind="task",
            principal=principal or task_ctx.task.name,
            execution_key=str(tr.id),
            run_count=max(1, int(tr.run_count)),
            retries=int(task_ctx.task.retries or 0),
            flow_run_id=str(tr.flow_run_id) if tr.flow_run_id else None,
            task_run_id=str(tr.id),
            flow_name=flow_name,
            deployment_name=deployment,
            retry_condition=task_ctx.task.retry_condition_fn,
            task=task_ctx.task,
            task_run=tr,
        )
    if flow_ctx is not None and flow_ctx.flow_run is not None:
        fr = flow_ctx.flow_run
        retries = flow_ctx.flow.retries if flow_ctx.flow is not None else 0
        return RunIdentity(
            kind="flow",
            principal=principal or str(fr.name),
            execution_key=str(fr.id),
            run_count=max(1, int(fr.run_count)),
            retries=int(retries or 0),
            flow_run_id=str(fr.id),
            flow_name=flow_name,
            deployment_name=deployment,
        )
    return RunIdentity(kind="none", principal=_settings().principal, execution_key=uuid.uuid4().hex)


def retry_follows(ident: RunIdentity, exc: BaseException) -> bool:
    """Whether Prefect will retry the run of ``ident`` after it fails with ``exc``.

    True when the task or flow has retries left (``run_count <= retries``) and, for a task
    with a ``retry_condition_fn``, that function (called here as Prefect calls it) says so.
    A loss of the lease, a ``BaseException`` (cancellation) or an async/failing retry
    condition count as "no retry", so the caller releases rather than strands the lease.
    """
    from prefect_baton.errors import LeaseLostError

    if not isinstance(exc, Exception) or isinstance(exc, LeaseLostError):
        return False
    if not ident.in_run or ident.retries_left <= 0:
        return False
    cond = ident.retry_condition
    if cond is None:
        return True
    try:
        from prefect.states import Failed

        verdict = cond(ident.task, ident.task_run, Failed(data=exc))
    except Exception:
        return False
    if inspect.isawaitable(verdict):
        if inspect.iscoroutine(verdict):
            verdict.close()
        return False
    return bool(verdict)


# --------------------------------------------------------------------------- clients

_bases: dict[tuple[Any, ...], Baton] = {}
_derived: dict[tuple[int, str], Baton] = {}
_clients_lock = threading.Lock()


def _as(base: Baton, principal: str) -> Baton:
    """``base`` acting as ``principal``: ``base`` itself, or a client derived from it once
    per process (sharing its connections)."""
    if base.principal == principal:
        return base
    dkey = (id(base), principal)
    with _clients_lock:
        b = _derived.get(dkey)
        if b is None:
            b = _derived[dkey] = base.as_principal(principal, base.role)
    return b


def _default_baton() -> Baton:
    """``Baton.from_settings()``, one per distinct ``BATON_*`` configuration and process."""
    s = _settings()
    redis = s.redis_url.get_secret_value() if s.redis_url else None
    key = (s.ledger_url, redis, s.org, s.role, s.receipt_retention_seconds, s.state_max_bytes)
    with _clients_lock:
        base = _bases.get(key)
    if base is None:
        base = Baton(settings=s)
        with _clients_lock:
            base = _bases.setdefault(key, base)
    return base


def prefect_api_known() -> bool:
    """``True`` inside a Prefect flow or task run, or when ``PREFECT_API_URL`` is set: where
    Prefect's client reaches an API. Anywhere else a Prefect client call (emitting an event,
    loading a Block) would start a temporary Prefect server of its own (7-20 s), so
    prefect-baton does not call Prefect there."""
    from prefect.settings import PREFECT_API_URL

    if FlowRunContext.get() is not None or TaskRunContext.get() is not None:
        return True
    return bool(PREFECT_API_URL.value())


def _block_baton(ref: str) -> tuple[Baton, str | None]:
    """The client of the saved block ``"baton/<name>"`` and the block's ``principal``;
    the block is loaded from the Prefect API once per process (a load costs about 50 ms).

    A block lives in a Prefect API: outside a flow or task run and without
    ``PREFECT_API_URL`` (:func:`prefect_api_known` is ``False``) there is none to load it
    from, and Prefect would start a temporary server of its own (with no blocks saved in
    it), so that is an error instead.

    Raises:
        ValidationError: ``ref`` is not ``"baton/<block name>"``; or no Prefect API is
            known (outside a run, ``PREFECT_API_URL`` unset).
        NotFoundError: the Prefect API has no Baton block of that name.
    """
    check_baton(ref)
    name = ref[len(BLOCK_PREFIX) :]
    with _clients_lock:
        found = _blocks.get(name)
    if found is None:
        from prefect.exceptions import ObjectNotFound

        from prefect_baton.prefect._block import BatonBlock

        if not prefect_api_known():
            raise ValidationError(
                f'baton="{ref}" names a Block, which is loaded from a Prefect API, but '
                "PREFECT_API_URL is unset (and this is not a flow or task run): set "
                "PREFECT_API_URL, or pass a Baton (Baton.from_settings()) instead"
            )
        try:
            # _sync: blocking even when called on an event loop (an async task)
            block = cast(BatonBlock, BatonBlock.load(name, _sync=True))  # type: ignore[call-arg]
        except ValueError as exc:
            if not isinstance(exc.__cause__, ObjectNotFound):
                raise
            raise NotFoundError(
                f'baton="{ref}": the Prefect API has no Baton block named {name!r}; save '
                f"one (BatonBlock(ledger_url=...).save({name!r})) or fix the name"
            ) from None
        made = (block.baton(principal=block.principal), block.principal)
        with _clients_lock:
            found = _blocks.setdefault(name, made)
    return found


_blocks: dict[str, tuple[Baton, str | None]] = {}


def check_baton(baton: object) -> None:
    """Reject a ``baton=`` value that :func:`resolve_baton` cannot use (no I/O).

    Raises:
        ValidationError: a string that is not ``"baton/<block name>"``, or another type.
    """
    if baton is None or isinstance(baton, Baton | AsyncBaton):
        return
    if isinstance(baton, str):
        if not baton.startswith(BLOCK_PREFIX) or len(baton) == len(BLOCK_PREFIX):
            raise ValidationError(f'baton= takes "baton/<block name>", not {baton!r}')
        return
    if not callable(baton):
        raise ValidationError(
            "baton= must be a Baton, an AsyncBaton, a factory or "
            f'"baton/<block name>", not {type(baton).__name__}'
        )


def resolve_baton(
    baton: BatonLike | None, default_principal: str, principal: str | None = None
) -> Baton:
    """The client to act with.

    Args:
        baton: a :class:`Baton` or :class:`AsyncBaton` (used as given, with its own
            principal unless ``principal`` is given), a factory ``principal -> Baton``,
            ``"baton/<block name>"`` (the saved :class:`BatonBlock`, loaded once per
            process), or ``None``: ``Baton.from_settings()`` (``BATON_*`` variables, cached
            per process).
        default_principal: the run's default principal (``str``), acted as when neither
            ``principal`` nor the block names one.
        principal: the principal chosen by the caller (``principal=``), or ``None``.

    Raises:
        ValidationError: a bad principal, setting or block reference. TypeError: ``baton``
        is none of these. ForbiddenError: ``principal`` with a REST API client (its key
        decides the principal).
    """
    if baton is None:
        return _as(_default_baton(), principal or default_principal)
    if isinstance(baton, str):
        base, block_principal = _block_baton(baton)
        return _as(base, principal or block_principal or default_principal)
    if isinstance(baton, AsyncBaton):
        baton = baton.sync
    if isinstance(baton, Baton):
        return baton if principal is None else _as(baton, principal)
    if callable(baton):
        made = baton(principal or default_principal)
        if isinstance(made, AsyncBaton):
            return made.sync
        if not isinstance(made, Baton):
            raise TypeError(f"the baton factory returned {type(made).__name__}, not a Baton")
        return made
    raise TypeError(f"baton must be a Baton, an AsyncBaton or a factory, not {type(baton)!r}")


# --------------------------------------------------------------------------- current lease


@dataclass
class LeaseSlot:
    """What the active ``@leased`` / :func:`accept_handoff` block knows about its lease.

    Attributes:
        keeper: the :class:`LeaseKeeper` holding the lease.
        baton: the client that acquired it.
        identity: the run identity it was acquired under.
    """

    keeper: LeaseKeeper
    baton: Baton
    identity: RunIdentity

    @property
    def handed_off(self) -> bool:
        """``True`` once the lease rides on a handoff (:func:`handoff_to`, or
        ``handoffs.create(..., lease=current_lease())``; the keeper's
        :attr:`~LeaseKeeper.handoff`): the block then neither releases it nor treats its
        later loss as a failure."""
        return self.keeper.handoff is not None

    @property
    def handed_to(self) -> str | None:
        """``"handoff <id> to <principal>"`` (``str``) when :attr:`handed_off`, for the
        message of a Prefect retry that finds the lease transferred; else ``None``."""
        h = self.keeper.handoff
        return None if h is None else f"handoff {h.handoff_id} to {h.to_principal}"


_CURRENT: contextvars.ContextVar[LeaseSlot | None] = contextvars.ContextVar(
    "prefect_baton_current_lease", default=None
)


def current_lease() -> LeaseKeeper | None:
    """The lease held by the innermost active ``@leased`` function or
    :func:`accept_handoff` block, or ``None``.

    Pass it as ``fence=`` to checkpoint and outcome writes, so they are rejected with
    :class:`~prefect_baton.errors.StaleFenceError` once this lease generation is no longer
    current (DESIGN.md "Leases": ledger writes made under a lease carry it as a fence).
    """
    slot = _CURRENT.get()
    return slot.keeper if slot is not None else None


def current_baton() -> Baton | None:
    """The client of the innermost active ``@leased`` function or :func:`accept_handoff`
    block (acting as the run's principal), or ``None`` outside one."""
    slot = _CURRENT.get()
    return slot.baton if slot is not None else None


def current_slot() -> LeaseSlot | None:
    """The :class:`LeaseSlot` of the innermost active block, or ``None``."""
    return _CURRENT.get()


def push_slot(slot: LeaseSlot) -> contextvars.Token[LeaseSlot | None]:
    """Make ``slot`` current; reset with :func:`pop_slot`."""
    return _CURRENT.set(slot)


def pop_slot(token: contextvars.Token[LeaseSlot | None]) -> None:
    """Undo :func:`push_slot`."""
    _CURRENT.reset(token)
