"""A holder whose network is black-holed learns of its loss (``on_lost``, and
``cancel_on_loss`` interrupts the body) before anyone else can be granted the resource, on
every networked store: PostgreSQL, a real Redis and the REST API.

The holder reaches its server through :class:`BlackholeProxy`; once it holds its leases the
proxy stops forwarding (its sockets stay open, so the holder's renewal blocks in a read); a
rival on a direct connection polls until it is granted. The order of monotonic timestamps
taken in this process is asserted, not durations.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from prefect_baton import Baton, ConflictError, LeaseLostError
from prefect_baton.prefect import leased
from prefect_baton.prefect._interrupt import LeaseInterrupt
from tests.conftest import (
    PG_URL,
    REDIS_URL,
    require_postgresql,
    require_redis,
    rest_baton,
    store_for,
)
from tests.network._proxy import BlackholeProxy

pytestmark = pytest.mark.slow

TTL = 10  # the shortest TTL the rules allow


def _via(url: str, proxy: BlackholeProxy) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


def _target(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


@dataclass
class Marks:
    """Monotonic times seen in this process."""

    lost: float | None = None
    interrupted: float | None = None
    granted_after: dict[str, float] = field(default_factory=dict)


def _race(holder: Baton, rival: Baton, proxy: BlackholeProxy) -> Marks:
    """The holder takes two resources (a ``with`` block with ``on_lost``, and an
    ``@leased(cancel_on_loss=True)`` body), the proxy black-holes it, the rival polls both
    until granted. Returns the marks."""
    marks = Marks()
    rid = uuid.uuid4().hex[:8]
    held = threading.Event()
    done = threading.Event()
    failures: list[BaseException] = []

    def on_lost(_: Any) -> None:
        marks.lost = time.monotonic()

    @leased("svc", f"body-{rid}", ttl_seconds=TTL, cancel_on_loss=True, baton=holder)
    def body() -> None:
        held.set()
        try:
            while not done.is_set():
                time.sleep(0.02)
        except LeaseInterrupt:
            marks.interrupted = time.monotonic()
            raise

    def run_body() -> None:
        try:
            body()
        except LeaseLostError:
            pass
        except BaseException as exc:  # reported by the test
            failures.append(exc)

    block = holder.lease("svc", f"block-{rid}", ttl_seconds=TTL, on_lost=on_lost)
    with pytest.raises(LeaseLostError), block:  # noqa: PT012
        worker = threading.Thread(target=run_body, daemon=True)
        worker.start()
        assert held.wait(30), failures
        proxy.blackhole()
        pending = {f"block-{rid}", f"body-{rid}"}
        give_up = time.monotonic() + 60
        while pending and time.monotonic() < give_up:
            for name in sorted(pending):
                sent = time.monotonic()
                try:
                    rival.leases.acquire("svc", name, ttl_seconds=TTL)
                except ConflictError:
                    continue
                marks.granted_after[name] = sent  # the grant came after this moment
                pending.discard(name)
            time.sleep(0.05)
        done.set()
        proxy.heal()  # the holder's blocked calls are answered (LEASE_LOST) and its exit ends
        worker.join(30)
        assert block.lost
    assert not failures, failures
    assert not pending, "the rival was never granted"
    return marks


def _assert_loss_first(marks: Marks) -> None:
    assert marks.lost is not None, "on_lost never fired"
    assert marks.interrupted is not None, "cancel_on_loss never interrupted the body"
    first_grant = min(marks.granted_after.values())
    assert marks.lost < first_grant
    assert marks.interrupted < first_grant


@contextmanager
def _proxy(url: str, default_port: int) -> Iterator[BlackholeProxy]:
    proxy = BlackholeProxy(_target(url, default_port))
    try:
        yield proxy
    finally:
        proxy.close()


def _org() -> str:
    return f"org-{uuid.uuid4().hex[:12]}"


def _closing(*closers: Callable[[], None]) -> None:
    for close in closers:
        try:
            close()
        except Exception:
            pass


def test_postgresql_holder_learns_first() -> None:
    """PostgreSQL: the renewal blocks in psycopg; the renew deadline fires regardless."""
    require_postgresql()
    org = _org()
    with _proxy(PG_URL, 5432) as proxy:
        holder = Baton(ledger_url=_via(PG_URL, proxy), org=org, principal="holder")
        rival = Baton(org=org, principal="rival", store=store_for(PG_URL))
        try:
            marks = _race(holder, rival, proxy)
        finally:
            _closing(holder.close)
    _assert_loss_first(marks)


def test_redis_holder_learns_first(sqlite_url: str) -> None:
    """A real Redis: the renewal's script call blocks until its socket timeout."""
    require_redis()
    from prefect_baton._stores.redis.authority import RedisAuthority, connect

    org = _org()
    store = store_for(sqlite_url)
    with _proxy(REDIS_URL, 6379) as proxy:
        mine = RedisAuthority(connect(_via(REDIS_URL, proxy)), store, ack="redis", owns_client=True)
        theirs = RedisAuthority(connect(REDIS_URL), store, ack="redis", owns_client=True)
        holder = Baton(org=org, principal="holder", store=store, lease_authority=mine)
        rival = Baton(org=org, principal="rival", store=store, lease_authority=theirs)
        try:
            marks = _race(holder, rival, proxy)
        finally:
            _closing(mine.close, theirs.close)
    _assert_loss_first(marks)


def test_rest_holder_learns_first(rest_api: str, sqlite_url: str) -> None:
    """The REST API: the renewal's HTTP request gets no answer."""
    org = _org()
    with _proxy(rest_api, 80) as proxy:
        holder = rest_baton(f"http://127.0.0.1:{proxy.port}", sqlite_url, org)
        rival = rest_baton(rest_api, sqlite_url, org).as_principal("rival")
        try:
            marks = _race(holder, rival, proxy)
        finally:
            _closing(holder.close, rival.close)
    _assert_loss_first(marks)
