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
"""

from __future__ import annotations

import logging
import threading
import weakref

from prefect.context import FlowRunContext, TaskRunContext

__all__ = ["expected", "run_logger"]

log = logging.getLogger("prefect_baton.prefect")

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
        if info and info[1] is not None and info[1] in _expected:
            if record.msg == _ENGINE_EXIT:
                return False
            record.exc_info = None
            record.exc_text = None
        return True


def expected(exc: BaseException) -> BaseException:
    """Mark ``exc`` as an expected outcome whose traceback Prefect's run loggers leave out;
    returns ``exc``. The filter is installed on the first call."""
    global _installed
    _expected.add(exc)
    if not _installed:
        with _install_lock:
            if not _installed:
                for name in _PREFECT_RUN_LOGGERS:
                    logging.getLogger(name).addFilter(_NoExpectedTraceback())
                _installed = True
    return exc
