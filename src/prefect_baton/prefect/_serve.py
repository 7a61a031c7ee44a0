"""``serving(...)``: serve deployments from a background thread while the caller goes on.

``flow.serve()`` / ``prefect.serve()`` block the calling thread; examples, the four-role
scenario and tests need to serve the receiving deployments *and* start the first run from the
same script. The served flow runs execute in subprocesses, as with ``prefect.serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from prefect_baton._client.sync import Baton
from prefect_baton._exit import error_line, exit_code_for
from prefect_baton._settings import load_settings
from prefect_baton.errors import BatonError

__all__ = ["flow_main", "prefect_api", "reading_baton", "serving", "wait_for_run"]


def flow_main(
    flow: Any,
    *,
    name: str,
    doc: str | None,
    interval_seconds: float | None = None,
    argv: Sequence[str] | None = None,
    arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    parameters: Callable[[argparse.Namespace, argparse.ArgumentParser], dict[str, Any]]
    | None = None,
) -> Any:
    """The command line of a script in ``flows/``: run ``flow`` once and print its result,
    or serve it as deployment ``name`` with ``--serve``.

    Args:
        flow: the Prefect flow (``@flow`` function).
        name: the deployment name ``--serve`` registers (``"<flow name>/<name>"`` to run).
        doc: the script's docstring (its first line is the usage's description).
        interval_seconds: the served deployment's schedule (seconds, ``float``); ``None``
            serves it without one (runs start from an Automation or ``prefect deployment
            run``).
        argv: the arguments (default ``sys.argv[1:]``).
        arguments: adds the script's own options to the parser.
        parameters: the flow's parameters from the parsed options (with ``--serve``:
            the served deployment's default parameters); may call ``parser.error``.

    Returns:
        The flow's result when run once; ``None`` after serving (which blocks until
        interrupted).

    Raises:
        SystemExit: 2 with a usage message for bad arguments, 0 after ``--help``; when
            the run fails with a :class:`~prefect_baton.errors.BatonError`, the exit
            status of its code (``EXIT_CODES``: 5 for ``NOT_FOUND``, 2 for
            ``VALIDATION_ERROR`` ...) after one line ``<flow name>: CODE: message`` on
            stderr, as ``baton`` reports errors (no traceback); so too, as ``UNAVAILABLE``
            (11), when the Prefect API cannot be reached.
    """

    schedule = f" every {interval_seconds:g} s" if interval_seconds else " (no schedule)"
    parser = argparse.ArgumentParser(
        description=(doc or "").strip().split("\n")[0] or None,
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help=f"serve the flow as deployment {name!r}{schedule} until interrupted, instead "
        "of running it once",
    )
    if arguments is not None:
        arguments(parser)
    ns = parser.parse_args(argv)
    params = parameters(ns, parser) if parameters is not None else {}
    if ns.serve:
        flow.serve(name=name, interval=interval_seconds, parameters=params or None)
        return None
    try:
        result = flow(**params)
    except Exception as exc:
        error = exc if isinstance(exc, BatonError) else _api_unavailable(exc)
        if error is None:
            raise
        sys.stderr.write(error_line(getattr(flow, "name", name), error.to_dict()))
        raise SystemExit(exit_code_for(error.code)) from None
    print(result)
    return result


def _api_unavailable(exc: BaseException) -> BatonError | None:
    """``UNAVAILABLE`` when ``exc`` comes of a Prefect API that cannot be reached (Prefect
    raises ``RuntimeError("Failed to reach API at ...")`` from the transport error when a
    run starts): a transport error or 5xx answer anywhere in its chain of causes, as
    :func:`~prefect_baton.prefect._handoff.raise_if_unavailable` decides for
    ``handoff_to``; ``None`` for anything else."""
    from prefect_baton.prefect._handoff import raise_if_unavailable

    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, Exception):
            try:
                raise_if_unavailable(cause)
            except BatonError as unavailable:
                return unavailable
        cause = cause.__cause__ or cause.__context__
    return None


def reading_baton(**overrides: Any) -> Baton:
    """``Baton.from_settings(**overrides)`` for a ready-made flow that only reads the ledger
    (``flows/report_expired.py``, ``dispatch_handoffs.py``, ``resume_expired.py``,
    ``relay_events.py``): on a SQLite ledger file that does not exist it is ``NOT_FOUND``
    naming the path, as for ``baton``'s read commands, instead of creating an empty ledger
    and reporting nothing from it (a mistyped ``BATON_LEDGER_URL``, or the default
    ``./.baton/ledger.db`` of another working directory). A client of the REST API
    (``BATON_API_URL``) reads no file.

    Raises:
        NotFoundError: no ledger file at a SQLite ``BATON_LEDGER_URL``. ValidationError: a
            bad ``BATON_*`` variable or override.
    """
    from prefect_baton._stores.ledger.engine import require_ledger_file

    settings = load_settings(**overrides)
    if settings.api_url is None:
        require_ledger_file(settings.ledger_url, configured_by="BATON_LEDGER_URL")
    return Baton(settings=settings)


@contextmanager
def serving(
    *deployments: Any, poll_seconds: float = 1.0, drain_seconds: float = 30.0
) -> Iterator[Any]:
    """Serve ``deployments`` (from ``flow.to_deployment(name=...)``) while the block runs.

    When the block ends, the runner first waits (up to ``drain_seconds``) for the processes
    of the runs it started to exit, then stops. Prefect's runner cancels every run whose
    process it still tracks when it stops ("Runner is shutting down."), and a run that has
    already reported ``Completed`` keeps its process for a moment longer (flushing logs and
    events): stopping at once turned such finished runs ``Cancelled``.

    Args:
        deployments: ``prefect.deployments.runner.RunnerDeployment`` objects; they are
            registered with the Prefect API before the block starts.
        poll_seconds: how often the runner looks for scheduled runs (seconds, ``float``).
        drain_seconds: how long to wait for running flow-run processes to exit before the
            runner stops and cancels what is left (seconds, ``float``).

    Yields:
        The ``prefect.runner.Runner``.

    Raises:
        RuntimeError: the runner did not start within 60 s. Prefect API errors.
    """
    from prefect.runner import Runner

    runner = Runner(query_seconds=poll_seconds, limit=None, pause_on_shutdown=False)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    failure: list[BaseException] = []

    async def main() -> None:
        try:
            for d in deployments:
                await runner.aadd_deployment(d)
        except BaseException as exc:
            failure.append(exc)
            ready.set()
            return
        ready.set()
        await runner.start()

    thread = threading.Thread(
        target=loop.run_until_complete, args=(main(),), name="baton-serve", daemon=True
    )
    thread.start()
    if not ready.wait(60):
        raise RuntimeError("the Prefect runner did not start within 60 s")
    if failure:
        thread.join(5)
        raise failure[0]
    try:
        yield runner
    finally:
        if runner.started:
            asyncio.run_coroutine_threadsafe(_drain(runner, drain_seconds), loop).result(
                drain_seconds + 5
            )
            asyncio.run_coroutine_threadsafe(runner.astop(), loop).result(30)
        thread.join(30)
        if not thread.is_alive():
            loop.close()


async def _drain(runner: Any, timeout_seconds: float) -> None:
    """Wait until ``runner`` tracks no flow-run process (or ``timeout_seconds`` passed).

    ``Runner.astop`` cancels every run whose process is still tracked, even one that has
    reported a final state and is only exiting; waiting here first is what keeps a
    completed run ``Completed``. The runner's process manager is private in Prefect 3.9
    (``_process_manager.flow_run_ids()``); without it there is nothing to wait for.
    """
    manager = getattr(runner, "_process_manager", None)
    if manager is None or not hasattr(manager, "flow_run_ids"):
        return
    deadline = asyncio.get_running_loop().time() + timeout_seconds
    while manager.flow_run_ids() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.2)


@contextmanager
def prefect_api(startup_timeout_seconds: int = 120) -> Iterator[str]:
    """Make sure a Prefect API is reachable for the block; yields its URL.

    With ``PREFECT_API_URL`` set, that server is used. Otherwise Prefect's embedded server is
    started once for the block (about 20 s here) and ``PREFECT_API_URL`` points at it, also
    for the subprocesses that served flow runs execute in (else each would start its own).

    Raises:
        RuntimeError: the embedded server did not start in ``startup_timeout_seconds``.
    """
    import os

    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = PREFECT_API_URL.value()
    if url:
        yield str(url)
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start(timeout=startup_timeout_seconds)
    old = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            yield server.api_url
    finally:
        from prefect_baton.prefect._outbox import flush_events

        flush_events()  # in-run events still queued reach the server before it stops
        if old is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = old
        server.stop()


def wait_for_run(
    flow_run_id: Any, timeout_seconds: float = 300.0, poll_seconds: float = 0.5
) -> Any:
    """Wait until a flow run reaches a final state; returns the ``FlowRun``.

    Args:
        flow_run_id: the run's id (``uuid.UUID`` or ``str``).
        timeout_seconds: give up after this long (``float`` seconds).
        poll_seconds: how often to ask the API (``float`` seconds).

    Raises:
        TimeoutError: the run is not final after ``timeout_seconds``.
    """
    import time
    import uuid

    from prefect.client.orchestration import get_client

    run_id = flow_run_id if isinstance(flow_run_id, uuid.UUID) else uuid.UUID(str(flow_run_id))
    deadline = time.monotonic() + timeout_seconds
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(run_id)
            if run.state is not None and run.state.is_final():
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"flow run {run_id} not final after {timeout_seconds} s")
            time.sleep(poll_seconds)
