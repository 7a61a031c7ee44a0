"""Where the plugin's messages go: the Prefect run logger inside a run (so they are in the
run's logs in the UI), and no traceback for an expected conflict.

An ``on_conflict="raise"`` conflict is an expected outcome, not a bug: Prefect would log its
~35-line traceback once for the task run and once more for the flow run. The conflict is
still raised (the caller catches :class:`~prefect_baton.errors.ConflictError` as before), but
the exception is marked with :func:`expected`, and a filter on Prefect's ``prefect.task_runs``
and ``prefect.flow_runs`` loggers drops the traceback of a marked exception from the record,
keeping the one-line message (which names the resource and the holder's expiry).

A deployment run re-raises the final state's exception after "Finished in state ...", and
Prefect's engine logs it as "Engine execution exited with unexpected exception": for a marked
exception (a conflict, or the ``CancelledRun`` of an ``on_conflict="cancel"`` run) that record
is dropped, since the outcome is expected and the final state line already says it.

A flow run retry that ends without running the body (``Completed(name="HandedOff")``,
``Skipped`` or ``Cancelled``) after an attempt that failed: Prefect 3.9's
``FlowRunEngine.result()`` re-raises the *failed attempt's* exception whenever the run's
return value is a State (the engine keeps it as ``_raised``), so calling the flow raised it
and a deployment run logged it as "Engine execution exited with unexpected exception" (and
exited 1 without a runner to report the final state). :func:`settle_failed_attempt` marks
that exception expected and makes the engine forget it.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from prefect.context import FlowRunContext, TaskRunContext

from prefect_baton.errors import BatonError

__all__ = ["expected", "expected_errors", "run_logger", "settle_failed_attempt"]

log = logging.getLogger("prefect_baton.prefect")

#: the attribute marking an exception expected (any exception with a ``__dict__``, built-in
#: ones included, which cannot be weakly referenced), else membership of ``_expected``
_MARK = "_prefect_baton_expected"
_expected: weakref.WeakSet[BaseException] = weakref.WeakSet()
_installed = False
_install_lock = threading.Lock()
_PREFECT_RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs")


def run_logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The Prefect run logger inside a flow or task run (its records appear in the run's
    logs in the UI), else the ``prefect_baton.prefect`` logger."""
    if FlowRunContext.get() is not None or TaskRunContext.get() is not None:
        from prefect.exceptions import MissingContextError
        from prefect.logging import get_run_logger

        try:
            return get_run_logger()
        except MissingContextError:
            pass
    return log


# what prefect.flow_engine.run_flow logs when the run's final state raises (Prefect 3)
_ENGINE_EXIT = "Engine execution exited with unexpected exception"


class _NoExpectedTraceback(logging.Filter):
    """Drops the traceback of an exception marked :func:`expected` from a log record, and
    the engine's "unexpected exception" record for it altogether."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        if info and info[1] is not None and _is_expected(info[1]):
            if record.msg == _ENGINE_EXIT:
                return False
            record.exc_info = None
            record.exc_text = None
        return True


def _is_expected(exc: BaseException) -> bool:
    if getattr(exc, _MARK, False) is True:
        return True
    try:
        return exc in _expected
    except TypeError:
        return False


def expected(exc: BaseException) -> BaseException:
    """Mark ``exc`` as an expected outcome whose traceback Prefect's run loggers leave out;
    returns ``exc``. The filter is installed on the first call."""
    global _installed
    try:
        setattr(exc, _MARK, True)
    except (AttributeError, TypeError):  # an exception without a __dict__
        try:
            _expected.add(exc)
        except TypeError:  # nor weak references: its traceback stays
            pass
    if not _installed:
        with _install_lock:
            if not _installed:
                for name in _PREFECT_RUN_LOGGERS:
                    logging.getLogger(name).addFilter(_NoExpectedTraceback())
                _installed = True
    return exc


@contextmanager
def expected_errors() -> Iterator[None]:
    """Mark each :class:`~prefect_baton.errors.BatonError` raised in the block
    :func:`expected` and let it propagate: the body of a ready-made flow (``flows/``),
    whose errors (``NOT_FOUND`` for a deployment, ``VALIDATION_ERROR``, ``UNAVAILABLE``
    ...) each say in one line what is wrong. The run still ends ``Failed`` with the
    message; Prefect's run loggers leave out the traceback. Other exceptions (bugs) keep
    theirs."""
    try:
        yield
    except BatonError as exc:
        expected(exc)
        raise


_MISSING = object()


def _flow_engine(flow_run_id: str) -> Any:
    """Prefect's flow run engine running ``flow_run_id``, found among the callers' frames
    (the engine calls the flow's function), or ``None``."""
    try:
        from prefect.flow_engine import BaseFlowRunEngine
    except ImportError:  # pragma: no cover - another Prefect layout
        return None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        for name in ("self", "engine"):
            found = frame.f_locals.get(name)
            if isinstance(found, BaseFlowRunEngine):
                run = getattr(found, "flow_run", None)
                if str(getattr(run, "id", None)) == flow_run_id:
                    return found
        frame = frame.f_back
    return None


def settle_failed_attempt(flow_run_id: str, failure: BaseException | None) -> None:
    """Call when a retry of the flow run ``flow_run_id`` ends without running its body
    (its final state is returned, not raised) after an attempt that failed: the failed
    attempt's exception is then no outcome of the run.

    Marks ``failure`` (what that attempt raised, when this process saw it) and the
    exception Prefect's engine kept from it :func:`expected` (the filter drops the engine's
    "Engine execution exited with unexpected exception" record of it), and resets the
    engine's record of it so that ``FlowRunEngine.result()`` returns the final state's
    result instead of re-raising it (the caller of the flow gets ``None``, or the
    ``CancelledRun`` of a ``Cancelled`` run; a deployment run's process exits 0). The
    engine's record is Prefect's private ``_raised`` attribute (Prefect 3.9): it is read
    and reset only when present, else only the log record is dropped.

    Args:
        flow_run_id: the flow run's id (``str``).
        failure: the failed attempt's exception, or ``None``.
    """
    if failure is not None:
        expected(failure)
    engine = _flow_engine(flow_run_id)
    if engine is None:
        return
    raised = getattr(engine, "_raised", _MISSING)
    if not isinstance(raised, BaseException):
        return
    expected(raised)
    unset = getattr(type(engine), "_raised", _MISSING)  # the field's default: Prefect's NotSet
    if unset is not _MISSING and not isinstance(unset, BaseException):
        engine._raised = unset
