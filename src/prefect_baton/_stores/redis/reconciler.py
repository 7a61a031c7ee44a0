"""The reconciler: drains each org's Redis journal into the ledger, in order, idempotently.

Every Redis script that changes a lease appends one entry to the org's journal stream (all
the transitions of that call, the actor and the Redis time). Draining applies entries in
journal order, a batch per ledger transaction:

1. take the org's journal lock (``journal:<org>``: a PostgreSQL advisory lock; SQLite's
   ``BEGIN IMMEDIATE`` write lock), read the org's cursor (the last applied entry id and the
   journal's incarnation id) from the ledger;
2. read the entries after the cursor from Redis, and for each: upsert the lease rows
   (insert-or-ignore, then update only towards a newer state: a higher version, or the end
   of an active generation), insert the transitions (insert-or-ignore on the unique
   ``(lease_id, version, action)``), the acquire receipts, the handoff acceptance and the
   events (with ids derived from the entry, insert-or-ignore), as the ledger store itself
   writes them;
3. move the cursor and commit; only then trim the applied entries from the stream.

A journal entry the ledger refuses with a unique constraint (a generation whose epoch, or
whose active state, another generation of its resource already has: Redis handed out a
fencing token twice, which its partial-loss check exists to prevent) is a detected fault,
never a raw error nor a drain that fails forever: the batch is applied again one entry per
transaction up to that entry, which is recorded as a fault (its transitions, carrying the
epochs, and an entry of the org's fault row, which ``baton audit`` reports; its lease rows,
receipts and events are not written), and the org's incarnation marker is deleted, so every
operation of the org fails closed until its Redis state is rebuilt from the ledger with
higher epochs (:mod:`prefect_baton._stores.redis.rebuild`). The drain then goes on.

Applying an entry twice changes nothing, and entries are applied in the order Redis made
them, so the history's versions and epochs rise as on the ledger authority. The lag (how many
entries are not applied yet and how old the oldest one is) is :meth:`Reconciler.lag`.

Cost of a batch. Redis: one round trip to read (two XRANGEs in a pipeline: the journal's
first entry, for its incarnation id, and the entries after the cursor), one to trim.
PostgreSQL: one round trip for the lock and the cursor (a pipeline), one for all the
statements of step 2 and the cursor (a pipeline), one for the commit. A batch of at least
:data:`COPY_MIN_ENTRIES` entries writes its transitions, events and new lease rows with
``COPY`` instead (two round trips each; about two thirds of the server's cost of
``INSERT ... ON CONFLICT``); ``COPY`` cannot ignore a row that is already there, so when
some of the batch is in the ledger already (the cursor was lost, say) the transaction is
rolled back and the batch written again with insert-or-ignore: idempotency is unchanged.
A lease acquired and released within one batch is one lease row, written once in its final
state. The org and the actors are registered the first time a reconciler sees them (again
when an actor's role changes), not in every batch.

The reconciler's transactions keep the server's ``synchronous_commit``. Turning it off
would save little CPU (the server's WAL flush at commit is mostly waiting, not computing)
and would break the rule of step 3: the commit would return before its WAL is on disk, the
entries would be trimmed from Redis, and a crash of the database server in that window
would lose them from both places.

This module holds the drain loop (:class:`Reconciler`), :func:`run_reconciler` (``baton
reconcile``) and the client's drain thread (:class:`Drainer`); the rows and SQL statements
of a batch are in :mod:`prefect_baton._stores.redis.ledger_writes`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from redis.exceptions import RedisError
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from prefect_baton._stores.ledger.engine import ledger_failure, write_turn_timed_out
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.redis.cluster import RedisClient, node_time_ms
from prefect_baton._stores.redis.codec import journal_payload
from prefect_baton._stores.redis.keys import DEFAULT_BATCH, ORGS_KEY, org_keys
from prefect_baton._stores.redis.ledger_writes import Batch, LedgerWriter
from prefect_baton.errors import UnavailableError

__all__ = ["DEFAULT_BATCH", "Lag", "ReconcileReport", "Reconciler", "run_reconciler"]

log = logging.getLogger("prefect_baton.reconciler")

COPY_MIN_ENTRIES = 64
"""Batches of at least this many entries write their new rows with ``COPY`` on PostgreSQL
(see :meth:`LedgerWriter._flush`); a smaller batch sends all its statements in one
pipeline, which costs fewer round trips than the ``COPY`` commands save."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def id_tuple(entry_id: str) -> tuple[int, int]:
    """A stream entry id ``"<ms>-<seq>"`` as a comparable tuple of ints."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _payload(fields: Any) -> dict[str, Any]:
    return journal_payload(fields[b"p"] if b"p" in fields else fields["p"])


_REFUSED = (IntegrityError, psycopg.errors.IntegrityError)
"""What the ledger raises when a journal entry breaks one of its unique constraints."""


def _unavailable(exc: Exception) -> UnavailableError:
    return UnavailableError(f"Redis unavailable to the reconciler: {exc}")


@dataclass(frozen=True)
class Lag:
    """How far the ledger is behind an org's journal.

    Attributes:
        entries: journal entries not yet trimmed (``int``; applied-but-untrimmed entries,
            at most one batch, count too).
        seconds: age of the oldest of them on the Redis clock (``float``, 0 when none).
        oldest_id: its stream id (``str``) or ``None``.
    """

    entries: int
    seconds: float
    oldest_id: str | None = None


@dataclass
class ReconcileReport:
    """What :func:`run_reconciler` did: ``applied`` entries (``int``) per org in ``orgs``
    and the final ``lag`` of each (:class:`Lag`)."""

    orgs: list[str] = field(default_factory=list)
    applied: int = 0
    lag: dict[str, Lag] = field(default_factory=dict)


class Reconciler(LedgerWriter):
    """Drains Redis journals into one ledger.

    Args:
        client: the Redis client of the authority (``redis.Redis`` or
            ``redis.cluster.RedisCluster``).
        store: the ledger (:class:`prefect_baton._stores.ledger.store.LedgerStore`).
        batch_size: entries per ledger transaction (``int``, default 2,000).

    Every method may raise :class:`UnavailableError` when Redis or the ledger cannot be
    reached; nothing is acknowledged (trimmed) that the ledger has not committed.
    """

    def __init__(self, client: RedisClient, store: LedgerStore, *, batch_size: int = DEFAULT_BATCH):
        super().__init__(store)
        self.client = client
        self.batch_size = max(1, int(batch_size))
        #: ids of the journal entries this reconciler recorded as faults (the newest 1,000)
        self.refused: deque[str] = deque(maxlen=1000)
        #: per org, ``time.monotonic()`` just before the last journal read that reached
        #: its end (under ``batch_size`` entries), once what it read was committed: nothing
        #: older waits for the ledger. The authority's lag limit skips its length read then.
        self.caught_up_at: dict[str, float] = {}

    # ------------------------------------------------------------------ public

    def drain(self, org: str, *, until: str | None = None, max_batches: int | None = None) -> int:
        """Apply the org's pending journal entries; returns how many were applied (``int``).

        Args:
            org: the organization.
            until: stop once this entry id (``"<ms>-<seq>"``) is applied (``None``: drain
                everything pending).
            max_batches: stop after this many batches (``None``: no limit).

        A batch shorter than ``batch_size`` reached the end of the journal: the drain stops
        there (entries appended since are left for the next drain).
        """
        if until is not None and self._applied(org, until):
            return 0
        total = 0
        batches = 0
        while max_batches is None or batches < max_batches:
            n, last = self.drain_once(org)
            total += n
            batches += 1
            if n < self.batch_size:
                break
            if until is not None and last is not None and id_tuple(last) >= id_tuple(until):
                break
        return total

    def drain_once(self, org: str) -> tuple[int, str | None]:
        """Apply one batch (at most ``batch_size`` entries) in one ledger transaction.

        Returns ``(applied, last applied entry id or None)``.
        """
        journal = org_keys(org).base.journal
        try:
            try:
                try:
                    n, last, batch = self._apply(org, journal, copy=not self._sqlite)
                except psycopg.errors.UniqueViolation:
                    # some of the batch is in the ledger already (a lost cursor, say): COPY
                    # cannot skip it, so write the batch again with insert-or-ignore
                    log.info("journal entries of %s already in the ledger; re-applying", org)
                    n, last, batch = self._apply(org, journal, copy=False)
            except _REFUSED:
                n, last, batch = self._quarantine(org, journal)
        except RedisError as exc:
            raise _unavailable(exc) from exc
        except (OperationalError, psycopg.OperationalError) as exc:
            raise ledger_failure(self.store.engines, exc) from exc
        except PoolTimeoutError as exc:
            raise write_turn_timed_out() from exc
        if last is None:
            return 0, None
        self._committed(org, batch)
        ms, seq = id_tuple(last)
        try:
            self.client.xtrim(journal, minid=f"{ms}-{seq + 1}", approximate=False)
        except RedisError as exc:  # applied and committed; trimmed by the next drain
            log.info("could not trim the journal of %s: %s", org, exc)
        return n, last

    def _apply(
        self, org: str, journal: str, *, copy: bool, limit: int | None = None
    ) -> tuple[int, str | None, Batch]:
        """Steps 1 and 2 of a batch (at most ``limit`` entries, default ``batch_size``),
        committed: ``(entries applied, last entry id or None, the batch)``."""
        batch = Batch()
        if limit is None:
            # An empty journal has nothing to apply: every entry appended before this read
            # was applied, committed and only then trimmed. One O(1) read of its newest
            # entry instead of a ledger write transaction (SQLite's write lock) on every
            # idle round of a drain thread.
            read_at = time.monotonic()
            if not self.client.xrevrange(journal, count=1):
                self.caught_up_at[org] = read_at
                return 0, None, batch
        with self.store.engines.write.begin() as conn:
            cursor = self._lock_and_read_cursor(conn, org)
            read_at = time.monotonic()
            stream_inc, entries = self._read(journal, cursor, limit)
            if entries:
                for raw_id, fields in entries:
                    self._collect(conn, org, _text(raw_id), _payload(fields), batch)
                copy = copy and len(entries) >= COPY_MIN_ENTRIES
                self._flush(conn, org, batch, (stream_inc, _text(entries[-1][0])), copy=copy)
        if len(entries) < self.batch_size:  # committed, and the journal had caught up
            self.caught_up_at[org] = read_at
        if not entries:
            return 0, None, batch
        return len(entries), _text(entries[-1][0]), batch

    def _read(
        self, journal: str, cursor: tuple[str, str] | None, limit: int | None = None
    ) -> tuple[str, list[tuple[Any, Any]]]:
        """The journal's incarnation id and up to ``limit`` (default ``batch_size``)
        entries after ``cursor`` (all from the start when the cursor is of another
        incarnation, or ``None``): one Redis round trip (two XRANGEs in a pipeline), two
        when the incarnation changed."""
        count = limit or self.batch_size
        if cursor is None:
            entries: Any = self.client.xrange(journal, min="-", count=count)
            return ("", []) if not entries else (str(_payload(entries[0][1])["i"]), entries)
        pipe = self.client.pipeline(transaction=False)
        pipe.xrange(journal, count=1)
        pipe.xrange(journal, min="(" + cursor[1], count=count)
        first, entries = pipe.execute()
        if not first:
            return "", []
        stream_inc = str(_payload(first[0][1])["i"])
        if stream_inc != cursor[0]:
            entries = self.client.xrange(journal, min="-", count=count)
        return stream_inc, entries

    def _quarantine(self, org: str, journal: str) -> tuple[int, str | None, Batch]:
        """A batch that the ledger refused with a unique constraint (see the module
        docstring): apply its entries one per transaction up to the refused one, record
        that one as a fault and fail the org closed. Returns as :meth:`_apply` (the
        refused entry counts as applied: the cursor is past it)."""
        total, last = 0, None
        while total < self.batch_size:
            try:
                n, got, one = self._apply(org, journal, copy=False, limit=1)
            except _REFUSED as exc:
                return total + 1, self._fault(org, journal, exc), Batch()
            if got is None:
                break
            self._committed(org, one)
            total, last = total + n, got
        return total, last, Batch()

    def _fault(self, org: str, journal: str, exc: Exception) -> str | None:
        """Record the next journal entry, which the ledger refused with ``exc``, as a fault
        (:meth:`LedgerWriter._write_fault`), then delete the org's incarnation marker (its
        Redis state is not to be trusted: it is rebuilt from the ledger). Returns the
        entry's id."""
        error = str(getattr(exc, "orig", None) or exc)
        with self.store.engines.write.begin() as conn:
            cursor = self._lock_and_read_cursor(conn, org)
            stream_inc, entries = self._read(journal, cursor, 1)
            if not entries:
                return None
            eid = _text(entries[0][0])
            fault = self._write_fault(conn, org, (stream_inc, eid), _payload(entries[0][1]), error)
        self.refused.append(eid)
        log.error(
            "journal entry %s of org %r was refused by the ledger (%s) and recorded as a "
            "fault: %s; the org's Redis state is rebuilt from the ledger",
            eid,
            org,
            error,
            fault["generations"],
        )
        try:
            self.client.delete(org_keys(org).base.inc)
        except RedisError as err:
            log.error("could not delete the incarnation marker of %r: %s", org, err)
        return eid

    def lag(self, org: str) -> Lag:
        """The org's current :class:`Lag` (two Redis commands)."""
        journal = org_keys(org).base.journal
        try:
            n = int(self.client.xlen(journal))
            if n == 0:
                return Lag(0, 0.0, None)
            first = self.client.xrange(journal, count=1)
            now_ms = node_time_ms(self.client, journal)
        except RedisError as exc:
            raise _unavailable(exc) from exc
        if not first:
            return Lag(0, 0.0, None)
        oldest = _text(first[0][0])
        return Lag(n, max(0.0, (now_ms - id_tuple(oldest)[0]) / 1000.0), oldest)

    # ------------------------------------------------------------------ internals

    def _applied(self, org: str, entry_id: str) -> bool:
        try:
            first = self.client.xrange(org_keys(org).base.journal, count=1)
        except RedisError as exc:
            raise _unavailable(exc) from exc
        return not first or id_tuple(_text(first[0][0])) > id_tuple(entry_id)


def registered_orgs(client: RedisClient) -> list[str]:
    """The orgs whose Redis lease state was ever set up (the ``baton:orgs`` set)."""
    try:
        return sorted(_text(m) for m in client.smembers(ORGS_KEY))
    except RedisError as exc:
        raise _unavailable(exc) from exc


def run_reconciler(
    redis_url: str | None = None,
    ledger_url: str | None = None,
    *,
    orgs: Sequence[str] | None = None,
    follow: bool = False,
    interval_seconds: float = 0.5,
    batch_size: int = DEFAULT_BATCH,
    stop: threading.Event | None = None,
    on_batch: Callable[[str, int, Lag], None] | None = None,
    client: RedisClient | None = None,
    store: LedgerStore | None = None,
) -> ReconcileReport:
    """Drain Redis lease journals into the ledger (what ``baton reconcile`` runs).

    Args:
        redis_url: Redis URL (default ``BATON_REDIS_URL``).
        ledger_url: ledger URL (default ``BATON_LEDGER_URL`` or the SQLite default).
        orgs: the orgs to drain (default: every org registered in ``baton:orgs``, re-read
            each round when following).
        follow: keep draining until ``stop`` is set (or the process is interrupted);
            otherwise drain what is pending once and return.
        interval_seconds: pause between rounds that applied less than one batch per org
            (``float``, seconds): entries gather into larger batches meanwhile.
        batch_size: entries per ledger transaction.
        stop: an event that ends ``follow`` mode.
        on_batch: called as ``on_batch(org, applied, lag)`` after each round of an org that
            applied something.
        client, store: use these instead of connecting from URLs.

    Returns:
        A :class:`ReconcileReport` with what was applied and the final lag of each org.

    Raises:
        ValidationError: no Redis URL configured. UnavailableError: Redis or the ledger
            is unreachable (in ``follow`` mode only when it is so at start). NotFoundError:
            a SQLite ledger file that does not exist (nothing is created or drained).
    """
    from prefect_baton._settings import BatonSettings
    from prefect_baton._stores.redis.connection import connect
    from prefect_baton.errors import ValidationError

    settings = BatonSettings()
    own_store = store is None
    if client is None:
        url = redis_url or (settings.redis_url.get_secret_value() if settings.redis_url else None)
        if not url:
            raise ValidationError("no Redis URL: pass redis_url or set BATON_REDIS_URL")
        client = connect(url)
    if store is None:
        from prefect_baton._stores.ledger.engine import require_ledger_file

        # the journal belongs to the ledger its clients write: drained into a new, empty
        # SQLite file (a mistyped path) it would be gone from Redis and missing there
        require_ledger_file(
            ledger_url or settings.ledger_url,
            configured_by="the ledger URL (--ledger-url or BATON_LEDGER_URL)",
        )
        store = LedgerStore.from_settings(settings, ledger_url)
    rec = Reconciler(client, store, batch_size=batch_size)
    report = ReconcileReport()
    stop = stop or threading.Event()
    try:
        while True:
            targets: Iterable[str] = orgs if orgs is not None else registered_orgs(client)
            busy = False
            for org in targets:
                if org not in report.orgs:
                    report.orgs.append(org)
                try:
                    n = rec.drain(org)
                except UnavailableError as exc:
                    if not follow:
                        raise
                    log.warning("reconcile of %s failed, will retry: %s", org, exc)
                    continue
                report.applied += n
                busy = busy or n >= rec.batch_size
                if n and on_batch is not None:
                    on_batch(org, n, rec.lag(org))
            if not follow or stop.is_set():
                break
            if not busy:
                stop.wait(interval_seconds)
            if stop.is_set():
                break
        for org in report.orgs:
            try:
                report.lag[org] = rec.lag(org)
            except UnavailableError:
                pass
    finally:
        if own_store:
            store.close()
    return report


def _report_failure(org: str, exc: Exception, in_a_row: int) -> None:
    """Log a failed background drain of ``org``: a warning for the first of a run of
    failures and then for every 60th (about every 5 minutes at the 5 s backoff), the others
    at debug level, so that an outage of Redis or the ledger does not flood the log."""
    if in_a_row == 1 or in_a_row % 60 == 0:
        again = "" if in_a_row == 1 else f" ({in_a_row} attempts in a row)"
        log.warning("background reconcile of %s failed%s: %s", org, again, exc)
    else:
        log.debug("background reconcile of %s failed again: %s", org, exc)


class Drainer:
    """A daemon thread that keeps draining the orgs it was given: for good (``ack="redis"``),
    or until their journal has caught up once (``ack="ledger"`` after a drain failed, so a
    ledger that comes back is brought up to date without waiting for the next call).

    Args:
        reconciler: the :class:`Reconciler` to drive.
        interval_seconds: pause after a round that caught up with every journal
            (``float``, default 0.05 s); a failed round backs off from 0.1 s doubling to 5 s.
    """

    def __init__(self, reconciler: Reconciler, *, interval_seconds: float = 0.05) -> None:
        self.reconciler = reconciler
        self.interval = interval_seconds
        self.orgs: set[str] = set()
        self._until_caught_up: set[str] = set()
        self._lock = threading.Lock()
        self._round = threading.Lock()  # held while one org's drain runs (its transactions)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="baton-reconciler", daemon=True)
        self._thread.start()

    def add(self, org: str, *, until_caught_up: bool = False) -> None:
        """Drain ``org`` too from now on (waking the thread the first time only, so that
        entries accumulate into batches between rounds); with ``until_caught_up`` only until
        a round drains its journal to the end (an org already drained for good stays so)."""
        with self._lock:
            if org in self.orgs:
                return
            self.orgs.add(org)
            if until_caught_up:
                self._until_caught_up.add(org)
        self._wake.set()

    def alive(self) -> bool:
        """Whether the thread still runs."""
        return self._thread.is_alive()

    def _run(self) -> None:
        backoff = self.interval
        failures: dict[str, int] = {}  # org -> drains failed in a row
        while not self._stop.is_set():
            busy = False
            failed = False
            for org in list(self.orgs):
                try:
                    with self._round:
                        n = self.reconciler.drain(org, max_batches=8)
                except Exception as exc:
                    failed = True
                    failures[org] = failures.get(org, 0) + 1
                    _report_failure(org, exc, failures[org])
                    continue
                if org in failures:
                    log.warning(
                        "background reconcile of %s works again after %d failed attempts",
                        org,
                        failures.pop(org),
                    )
                caught_up = n < 8 * self.reconciler.batch_size
                busy = busy or not caught_up
                if caught_up and org in self._until_caught_up:
                    with self._lock:
                        self._until_caught_up.discard(org)
                        self.orgs.discard(org)
            if failed:
                backoff = min(max(backoff * 2, 0.1), 5.0)
                self._stop.wait(backoff)
                continue
            backoff = self.interval
            if not busy:
                self._wake.wait(self.interval if self.orgs else None)
                self._wake.clear()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the thread between drains for the block: waits for a drain in progress (and
        its ledger transaction) to finish, and no drain starts until the block ends. For a
        process about to be stopped (``SIGSTOP``, a debugger): a drain stopped inside its
        transaction would hold the journal lock, on SQLite the database's write lock, and
        block every other writer for up to the busy timeout (30 s)."""
        with self._round:
            yield

    def stop(self, *, timeout: float = 10.0) -> None:
        """Stop the thread (after the round in progress) and wait up to ``timeout`` s."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
