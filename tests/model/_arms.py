"""The authorities the state-machine test drives, and how each one is made to see time pass
or to lose its Redis data.

Every arm is a lease authority (``LedgerStore`` or ``RedisAuthority``, called through the
:class:`~prefect_baton._stores.protocol.LeaseAuthority` protocol) plus the ledger behind it.

Time. Leases live at least :data:`MIN_TTL_S` seconds, so a test cannot wait for them to run
out. The model keeps a clock of its own (epoch ms), and each arm follows it:

* ``sqlite`` (the ledger authority) runs on the model's clock: the store reads the time
  through its ``_now_sql`` statement, which the test replaces by ``SELECT <model now>``
  (:meth:`Arm.set_time`), so every read of the clock (decisions, receipts, events) sees the
  model's time, to the millisecond.
* ``fakeredis`` (the Redis authority on fakeredis, ``ack="ledger"``, ``EVALSHA``) runs on the
  model's clock too: the scripts read Redis ``TIME``, and the test wraps fakeredis's ``TIME``
  command so that this arm's fake server answers the model's time (other fake servers of the
  session keep the true time); the ledger behind it reads the same time, so the rebuild after
  a data loss (which reads the ledger's clock and Redis ``TIME``) sees one consistent clock.
  These two arms' instants (acquired, expires, released) are compared with the model's, and
  they see a lease exactly at its expiry as the core does.
* ``redis`` (the Redis authority on the real server at 127.0.0.1:6379, ``ack="redis"`` with
  the drain thread, ``FCALL``): the server's clock cannot be moved. It runs on the wall clock,
  and when the model's clock moves forward by ``delta`` (:meth:`Arm.advance`) the test moves
  the stored times of the org's effective generations ``delta`` into the past instead,
  consistently in both places a later decision can read them: every active head generation
  in Redis (its ``acquired_at`` and ``expires_at`` fields, and the expiry in the scope index
  ``se`` of a scoped one) and the active rows of the ledger behind it (the rebuild after a
  data loss restores heads from those rows). The journal is drained into the ledger first,
  so no pending entry rewrites a row afterwards. Generations that are not active are never
  read for their expiry, so they are left alone. For every decision of the lease rules
  (effective means ``active`` and ``expires_at > now``), moving every active expiry back by
  ``delta`` is the same as moving the clock forward by ``delta``. Since the wall clock moves
  on as well, the test keeps every effective lease's expiry either at or before the model's
  "now" or more than :data:`MARGIN_MS` after it (see ``AuthoritiesMachine.advance``); an
  example takes a few seconds, far below that margin. This arm's instants are not compared.

Data loss (Redis arms): the org's journal is drained into the ledger (with ``ack="redis"``,
a loss right after a drain; what ``ack="redis"`` may lose beyond that is documented in
``_stores/redis/rebuild.py`` and tested in ``tests/redis/test_faults.py``), then every key of
the org is deleted (on the real server only this org's keys, found by its key prefix, never
``FLUSHALL``). The next operation finds the incarnation marker missing and rebuilds the
org's state from the ledger.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text, update
from sqlmodel import col

from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.ledger.tables import GenerationRow
from prefect_baton._stores.protocol import Caller
from prefect_baton._stores.redis.authority import RedisAuthority
from prefect_baton._stores.redis.connection import as_text
from prefect_baton._stores.redis.keys import ORGS_KEY, org_keys

MIN_TTL_S = 120
"""The shortest TTL the test grants (seconds)."""
MARGIN_MS = 90_000
"""No effective lease's expiry comes closer than this to the model's "now" (ms), except when
a step expires it on purpose; the wall time an example takes must stay below it."""

# Fields of a generation's text (``_lib.lua``): status, acquired_at, expires_at, sid.
_STATUS, _ACQUIRED, _EXPIRES, _SID = 8, 9, 10, 16


class Arm:
    """One authority under test and the ledger behind it.

    Attributes:
        name: ``sqlite``, ``fakeredis`` or ``redis``.
        kind: ``ledger`` or ``redis``: which reference the arm is held to (only Redis arms
            lose data, and after a loss their epochs rise above a floor).
        auth: the lease authority.
        ledger: the ledger (``auth`` itself on the ledger arm).
        ids: the arm's lease id -> the model's lease id; ``back`` the reverse.
        exact_time: the arm runs on the model's clock (:meth:`set_time`), so its instants
            equal the model's.
    """

    name = "?"
    kind = "ledger"
    exact_time = False

    def __init__(self, auth: Any, ledger: LedgerStore) -> None:
        self.auth = auth
        self.ledger = ledger
        self.ids: dict[str, str] = {}
        self.back: dict[str, str] = {}

    def start(self, org: str) -> None:
        """Forget the id mapping of the previous example (each example has its own org); a
        Redis arm also makes the org's first incarnation (number 0, epoch floor 0), so that
        a data loss in the first step is a loss and not the org's first use."""
        self.ids.clear()
        self.back.clear()
        if self.kind == "redis":
            self.auth.inspect(Caller(org, "ops", "admin"), "res", "-")

    def bind(self, arm_id: str, model_id: str) -> None:
        """Record that the arm's generation ``arm_id`` is the model's ``model_id``."""
        assert arm_id not in self.ids, f"{self.name}: {arm_id} returned as a new generation twice"
        self.ids[arm_id] = model_id
        self.back[model_id] = arm_id

    def set_time(self, now_ms: int) -> None:
        """Set the arm's clock to the model's ``now_ms`` (arms with ``exact_time`` only; the
        others ignore it)."""

    def advance(self, org: str, delta_ms: int) -> None:
        """Let ``delta_ms`` milliseconds pass for this arm (see the module docstring)."""
        raise NotImplementedError

    def lose(self, org: str) -> None:
        """Lose the org's Redis data (Redis arms only)."""
        raise NotImplementedError

    def finish(self, org: str) -> None:
        """Clean up after an example (nothing by default)."""

    def close(self) -> None:
        """Release the arm's resources at the end of the test."""


def _freeze_clock(store: LedgerStore, now_ms: int) -> None:
    """Make ``store`` read ``now_ms`` as its database clock."""
    store._now_sql = text(f"SELECT {int(now_ms)}")


class LedgerArm(Arm):
    """The SQLite ledger as the lease authority, on the model's clock."""

    name = "sqlite"
    exact_time = True

    def __init__(self, path: Path) -> None:
        store = LedgerStore(f"sqlite:///{path}")
        super().__init__(store, store)

    def set_time(self, now_ms: int) -> None:
        _freeze_clock(self.ledger, now_ms)

    def advance(self, org: str, delta_ms: int) -> None:
        """Nothing to do: :meth:`set_time` already moved the clock."""

    def close(self) -> None:
        self.ledger.close()


def _org_keys_of(client: Any, org: str) -> list[Any]:
    """Every Redis key of ``org`` (its keys share the prefix ``baton:{<tag>}:``; the braces
    are literal in a SCAN pattern)."""
    return list(client.scan_iter(match=org_keys(org).prefix + "*", count=1000))


def _drop_org(client: Any, org: str) -> None:
    keys = _org_keys_of(client, org)
    if keys:
        client.delete(*keys)


class FakeRedisArm(Arm):
    """The Redis authority on a fakeredis server of its own (``ack="ledger"``, scripts by
    ``EVALSHA``); its ``TIME`` and its ledger's clock answer the model's time."""

    name = "fakeredis"
    kind = "redis"

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        import fakeredis
        from fakeredis.commands_mixins.server_mixin import ServerCommandsMixin

        self.server = fakeredis.FakeServer()
        self.server.baton_now_ms = None
        original: Callable[[Any], list[bytes]] = ServerCommandsMixin.time

        def model_time(sock: Any) -> list[bytes]:
            now_ms = getattr(sock._server, "baton_now_ms", None)
            if now_ms is None:
                return original(sock)
            return [str(now_ms // 1000).encode(), str(now_ms % 1000 * 1000).encode()]

        monkeypatch.setattr(ServerCommandsMixin, "time", model_time)
        ledger = LedgerStore(f"sqlite:///{path}")
        client = fakeredis.FakeRedis(server=self.server)
        auth = RedisAuthority(client, ledger, ack="ledger", owns_client=True, functions=False)
        super().__init__(auth, ledger)

    def set_time(self, now_ms: int) -> None:
        self.server.baton_now_ms = now_ms
        _freeze_clock(self.ledger, now_ms)

    def advance(self, org: str, delta_ms: int) -> None:
        """Nothing to do: :meth:`set_time` already moved the clock."""

    def lose(self, org: str) -> None:
        self.auth.sync_ledger(org, strict=True)
        _drop_org(self.auth.client, org)

    def close(self) -> None:
        self.auth.close()
        self.ledger.close()


class ServerRedisArm(Arm):
    """The Redis authority on the real server (as the suite's ``redis`` arm: ``ack="redis"``
    with the drain thread, operations by ``FCALL``); time moves by rewriting the stored
    expiries of the org's active generations (see the module docstring)."""

    name = "redis"
    kind = "redis"

    def __init__(self, path: Path, make: Callable[[str, LedgerStore], Any]) -> None:
        ledger = LedgerStore(f"sqlite:///{path}")
        super().__init__(make("redis", ledger), ledger)
        self.orgs: list[str] = []

    def start(self, org: str) -> None:
        super().start(org)
        self.orgs.append(org)

    def advance(self, org: str, delta_ms: int) -> None:
        auth: RedisAuthority = self.auth
        auth.sync_ledger(org, strict=True)
        keys = org_keys(org)
        heads, se = keys.base[1], keys.base[8]
        client = auth.client
        for rd, raw in client.hgetall(heads).items():
            f = as_text(raw).split("\x00")
            if len(f) <= _SID:  # the pad field every per-org hash holds
                continue
            if f[_STATUS] != "active":
                continue
            f[_ACQUIRED] = str(int(f[_ACQUIRED]) - delta_ms)
            f[_EXPIRES] = str(int(f[_EXPIRES]) - delta_ms)
            client.hset(heads, rd, "\x00".join(f))
            sid = f[_SID]
            entry = client.hget(se, sid) if sid else None
            if entry is not None:
                _exp, _, owner = as_text(entry).partition("\x00")
                client.hset(se, sid, f"{f[_EXPIRES]}\x00{owner}")
        with self.ledger.engines.write.begin() as conn:
            conn.execute(
                update(GenerationRow)
                .where(col(GenerationRow.org_id) == org, col(GenerationRow.status) == "active")
                .values(
                    acquired_at_ms=col(GenerationRow.acquired_at_ms) - delta_ms,
                    expires_at_ms=col(GenerationRow.expires_at_ms) - delta_ms,
                )
            )

    def lose(self, org: str) -> None:
        self.auth.sync_ledger(org, strict=True)
        _drop_org(self.auth.client, org)

    def finish(self, org: str) -> None:
        """Leave nothing of the example's org on the shared server."""
        self.auth.sync_ledger(org)
        _drop_org(self.auth.client, org)
        self.auth.client.srem(ORGS_KEY, org)

    def close(self) -> None:
        for org in self.orgs:
            try:
                _drop_org(self.auth.client, org)
                self.auth.client.srem(ORGS_KEY, org)
            except Exception:
                pass
        self.auth.close()
        self.ledger.close()


def new_org() -> str:
    """A fresh organization id for one example."""
    return f"org-model-{uuid.uuid4().hex[:12]}"
