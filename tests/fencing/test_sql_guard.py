"""The SQL guard in the user's own transaction, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import MetaData, create_engine, insert, inspect, update
from sqlalchemy.orm import Session

from prefect_baton import StaleFenceError, ValidationError
from prefect_baton.fencing import (
    FENCE_TABLE_NAME,
    FencingToken,
    ensure_fence_table,
    fence_table,
    guard,
    highest_token,
)
from prefect_baton.testing import ManualClock, memory_baton
from tests.fencing._writer import fenced_write
from tests.fencing.conftest import UserDb

ROOT = Path(__file__).resolve().parents[2]


def _write(db: UserDb, token: int, writer: str, service: str = "svc") -> bool:
    return fenced_write(
        db.engine,
        (db.deploys, db.writes),
        namespace=db.namespace,
        service=service,
        token=token,
        writer=writer,
    )


def test_paused_old_holder_is_refused_after_the_new_holders_write(user_db: UserDb) -> None:
    """A holder paused past its lease writes after the next holder did: refused, and the
    next holder's write stands."""
    clock = ManualClock()
    with memory_baton(principal="worker-1", clock=clock) as b:
        old = b.leases.acquire("deploy", "svc", ttl_seconds=60)
        user_db.seed("svc")
        with user_db.engine.begin() as conn:
            assert guard(conn, old, namespace=user_db.namespace) == old.epoch
            conn.execute(update(user_db.deploys).values(version="old-1"))
        clock.advance(61)  # worker-1 is paused; its lease runs out
        new = b.as_principal("worker-2").leases.acquire("deploy", "svc", ttl_seconds=60)
        assert new.epoch > old.epoch
        with user_db.engine.begin() as conn:
            guard(conn, new, namespace=user_db.namespace)
            conn.execute(update(user_db.deploys).values(version="new-1"))
        # worker-1 wakes up and writes under its old lease
        with user_db.engine.begin() as conn:
            with pytest.raises(StaleFenceError, match=f"token {new.epoch} has written"):
                guard(conn, old, namespace=user_db.namespace)
            conn.rollback()  # as a writer must: the write below the guard never runs
        assert user_db.current("svc") == "new-1"
        with user_db.engine.connect() as conn:
            found = highest_token(conn, "deploy", "svc", namespace=user_db.namespace)
        assert found == new.epoch


def test_new_holder_waits_for_an_old_holder_inside_its_transaction(user_db: UserDb) -> None:
    """An old holder that passed the guard and paused before committing: the new holder's
    guard waits for that commit, so the new holder's write lands last."""
    user_db.seed("svc")
    assert _write(user_db, 1, "old")  # the fence row exists: the guard locks, not inserts
    done = threading.Event()
    errors: list[BaseException] = []

    def new_holder() -> None:
        try:
            assert _write(user_db, 2, "new")
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    with user_db.engine.begin() as conn:
        guard(conn, FencingToken("deploy", "svc", 1), namespace=user_db.namespace)
        thread = threading.Thread(target=new_holder)
        thread.start()
        done.wait(1.0)  # give the new holder time to run past its guard, if it could
        conn.execute(insert(user_db.writes).values(token=1, writer="old"))
        conn.execute(update(user_db.deploys).values(version="old@1"))
    thread.join(60)
    assert not errors, errors
    assert user_db.landed() == [(1, "old"), (1, "old"), (2, "new")]
    assert user_db.current("svc") == "new@2"


def test_equal_token_passes_every_time(user_db: UserDb) -> None:
    """One holder writes many times under one epoch; a lower token still fails after."""
    user_db.seed("svc")
    assert all(_write(user_db, 5, "holder") for _ in range(5))
    assert not _write(user_db, 4, "zombie")
    assert user_db.landed() == [(5, "holder")] * 5


def test_refused_write_changes_nothing(user_db: UserDb) -> None:
    """The refused transaction writes nothing: the user's row and the fence stay."""
    user_db.seed("svc")
    assert _write(user_db, 7, "b")
    assert not _write(user_db, 6, "a")
    assert user_db.current("svc") == "b@7"
    assert user_db.landed() == [(7, "b")]
    with user_db.engine.connect() as conn:
        assert highest_token(conn, "deploy", "svc", namespace=user_db.namespace) == 7


def test_resources_and_namespaces_are_independent(user_db: UserDb) -> None:
    """Tokens compare only within one (namespace, resource type, resource id)."""
    ns = user_db.namespace
    with user_db.engine.begin() as conn:
        guard(conn, FencingToken("deploy", "a", 9), namespace=ns)
        guard(conn, FencingToken("deploy", "b", 1), namespace=ns)
        guard(conn, FencingToken("build", "a", 1), namespace=ns)
        guard(conn, FencingToken("deploy", "a", 1), namespace=ns + "-other")
    with user_db.engine.connect() as conn:
        assert highest_token(conn, "deploy", "a", namespace=ns) == 9
        assert highest_token(conn, "deploy", "b", namespace=ns) == 1
        assert highest_token(conn, "deploy", "c", namespace=ns) is None


def test_guard_in_an_orm_session(user_db: UserDb) -> None:
    """A Session (SQLModel's too) works like a Connection, in the session's transaction."""
    user_db.seed("svc")
    with Session(user_db.engine) as session, session.begin():
        guard(session, FencingToken("deploy", "svc", 3), namespace=user_db.namespace)
        session.execute(update(user_db.deploys).values(version="v3"))
    with pytest.raises(StaleFenceError), Session(user_db.engine) as session, session.begin():
        guard(session, FencingToken("deploy", "svc", 2), namespace=user_db.namespace)
    assert user_db.current("svc") == "v3"


def _tokens(rng: random.Random, n: int) -> list[int]:
    """A writer's tokens: rising with repeats, as a holder that regains the lease."""
    return sorted(rng.randint(1, 40) for _ in range(n))


def _check_history(db: UserDb, landed: list[int], refused: list[int]) -> None:
    """Writes landed in non-decreasing token order; each refused one was below a landed
    one; the fence and the row end at the last write."""
    history = db.landed()
    assert sorted(t for t, _ in history) == sorted(landed)
    tokens = [t for t, _ in history]
    assert tokens == sorted(tokens), f"a lower token wrote after a higher one: {tokens}"
    assert landed
    assert refused, "no write was refused: the test did not interleave"
    assert all(t < max(landed) for t in refused)
    assert len(set(tokens)) < len(tokens), "no equal-token writes happened"
    with db.engine.connect() as conn:
        assert highest_token(conn, "deploy", "svc", namespace=db.namespace) == tokens[-1]
    last_token, last_writer = history[-1]
    assert db.current("svc") == f"{last_writer}@{last_token}"


def test_many_threads_with_interleaved_tokens(user_db: UserDb) -> None:
    """Twelve threads write one resource with interleaved tokens: tokens never go down."""
    user_db.seed("svc")
    rng = random.Random(1)
    plans = {f"t{i}": _tokens(rng, 20) for i in range(12)}
    results: dict[str, tuple[list[int], list[int]]] = {}
    start = threading.Barrier(len(plans))

    def run(writer: str, tokens: list[int]) -> None:
        start.wait()
        landed, refused = [], []
        for token in tokens:
            (landed if _write(user_db, token, writer) else refused).append(token)
        results[writer] = (landed, refused)

    threads = [threading.Thread(target=run, args=item) for item in plans.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert len(results) == len(plans)
    _check_history(
        user_db,
        [t for landed, _ in results.values() for t in landed],
        [t for _, refused in results.values() for t in refused],
    )


def test_many_processes_with_interleaved_tokens(user_db: UserDb, tmp_path: Path) -> None:
    """Four OS processes write one resource with interleaved tokens: tokens never go
    down, on both databases."""
    user_db.seed("svc")
    rng = random.Random(2)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    suffix = user_db.deploys.name.removeprefix("deploys_")
    procs = []
    for i in range(4):
        cfg = {
            "url": user_db.url,
            "suffix": suffix,
            "namespace": user_db.namespace,
            "service": "svc",
            "writer": f"p{i}",
            "tokens": _tokens(rng, 25),
            "barrier_dir": str(barrier),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.fencing._writer", json.dumps(cfg)],
                cwd=ROOT,
                env=os.environ.copy(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + 120
    while len(list(barrier.glob("ready-*"))) < len(procs):
        assert time.monotonic() < deadline, "writers did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.02)
    (barrier / "go").touch()
    landed: list[int] = []
    refused: list[int] = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        landed += result["landed"]
        refused += result["refused"]
    _check_history(user_db, landed, refused)


def test_ensure_fence_table_on_metadata_and_engine(tmp_path: Path) -> None:
    """On a MetaData the table is added (once); on an engine it is created (idempotent)."""
    md = MetaData()
    table = ensure_fence_table(md)
    assert table is not fence_table
    assert ensure_fence_table(md) is table
    assert md.tables[FENCE_TABLE_NAME].c.keys() == fence_table.c.keys()
    engine = create_engine(f"sqlite:///{tmp_path / 'mine.db'}")
    md.create_all(engine)
    assert inspect(engine).has_table(FENCE_TABLE_NAME)
    assert ensure_fence_table(engine) is fence_table
    other = create_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
    with other.begin() as conn:
        ensure_fence_table(conn)
    assert inspect(other).has_table(FENCE_TABLE_NAME)
    with pytest.raises(ValidationError, match="takes an Engine, a Connection or a MetaData"):
        ensure_fence_table("sqlite://")  # type: ignore[arg-type]


def test_bad_arguments_are_validation_errors(tmp_path: Path) -> None:
    """A bad bind, namespace or fence is VALIDATION_ERROR and writes nothing."""
    engine = create_engine(f"sqlite:///{tmp_path / 'user.db'}")
    ensure_fence_table(engine)
    token = FencingToken("deploy", "svc", 1)
    with pytest.raises(ValidationError, match="Connection or Session, got Engine"):
        guard(engine, token)  # type: ignore[arg-type]
    with engine.begin() as conn:
        with pytest.raises(ValidationError, match="namespace must not be empty"):
            guard(conn, token, namespace="")
        with pytest.raises(ValidationError, match="namespace must be a string"):
            guard(conn, token, namespace=3)  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match="a fence must be a Lease"):
            guard(conn, 5)  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match="from 0 to"):
            guard(conn, FencingToken("deploy", "svc", -3))
        assert highest_token(conn, "deploy", "svc") is None


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_ensure_fence_table_from_many_threads_at_once(kind: str, tmp_path: Path) -> None:
    """Several workers starting at once all create the table without an error (PostgreSQL:
    in a schema of the test's own, so the shared table is not touched)."""
    from sqlalchemy import text

    from tests.fencing.conftest import engine_for

    engine = engine_for(kind, tmp_path)
    schema = f"fence_race_{os.getpid()}_{random.randrange(10**9)}"
    if kind == "postgresql":
        with engine.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        engine.dispose()
        engine = create_engine(engine.url, connect_args={"options": f"-csearch_path={schema}"})
    try:
        errors: list[BaseException] = []
        start = threading.Barrier(6)

        def create() -> None:
            start.wait()
            try:
                ensure_fence_table(engine)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=create) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        with engine.begin() as conn:
            assert guard(conn, FencingToken("deploy", "svc", 1)) == 1
    finally:
        if kind == "postgresql":
            with engine.begin() as conn:
                conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()


def test_sqlite_without_upsert_returning_is_refused_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a SQLite older than 3.35 the guard says so, before writing anything."""
    import sqlite3

    engine = create_engine(f"sqlite:///{tmp_path / 'user.db'}")
    ensure_fence_table(engine)
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 34, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.34.1")
    with engine.begin() as conn:
        with pytest.raises(ValidationError, match=r"SQLite 3\.35 or later, this Python has 3\.34"):
            guard(conn, FencingToken("deploy", "svc", 1))
        assert highest_token(conn, "deploy", "svc") is None
