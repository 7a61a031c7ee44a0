"""The function library (``FUNCTION LOAD`` / ``FCALL``) against a redis-server of the test's
own: operations run through it where the server has functions, reload it when the server
lost it, fall back to the scripts (``EVALSHA``) where functions are refused, and clients of
either kind share one state."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import redis
from prefect_baton import Baton
from prefect_baton._stores.redis.authority import RedisAuthority, connect
from prefect_baton._stores.redis.scripts import library
from prefect_baton.errors import ConflictError
from tests.redis.conftest import RedisServer


def _baton(a: RedisAuthority, org: str = "org-fn", principal: str = "agent-a") -> Baton:
    return Baton(org=org, principal=principal, store=a.store, lease_authority=a)


def _libraries(url: str) -> list[str]:
    r = redis.Redis.from_url(url, decode_responses=True)
    try:
        # RESP2: each library is a flat list of alternating names and values.
        return [dict(zip(e[::2], e[1::2], strict=True))["library_name"] for e in r.function_list()]
    finally:
        r.close()


def test_operations_run_through_the_library(
    redis_server: RedisServer, make_authority: Callable[..., RedisAuthority]
) -> None:
    auth = make_authority()
    b = _baton(auth)
    lease = b.leases.acquire("db", "orders", ttl_seconds=30)
    assert auth.scripts.functions is True
    assert _libraries(redis_server.url) == [library().name]
    with pytest.raises(ConflictError):
        _baton(auth, principal="agent-b").leases.acquire("db", "orders", ttl_seconds=30)
    assert b.leases.release(lease).status == "released"


def test_a_deleted_library_is_loaded_again(
    redis_server: RedisServer, make_authority: Callable[..., RedisAuthority]
) -> None:
    auth = make_authority()
    b = _baton(auth)
    lease = b.leases.acquire("db", "orders", ttl_seconds=30)
    r = redis.Redis.from_url(redis_server.url)
    r.function_delete(library().name)
    r.close()
    assert _libraries(redis_server.url) == []
    # The lease state is untouched; the next call finds no function, loads the library
    # and runs the operation once.
    renewed = b.leases.renew(lease, ttl_seconds=60)
    assert renewed.version == lease.version + 1
    assert _libraries(redis_server.url) == [library().name]
    assert b.leases.release(renewed).status == "released"
    auth.reconciler.drain("org-fn")
    _rows, transitions = auth.store.lease_history("org-fn")
    assert [t.action for t in transitions] == ["acquire", "renew", "release"]


def test_a_restarted_empty_server_gets_the_library_and_a_rebuild(
    redis_server: RedisServer, make_authority: Callable[..., RedisAuthority]
) -> None:
    auth = make_authority(ack="ledger")
    b = _baton(auth)
    first = b.leases.acquire("db", "orders", ttl_seconds=30)
    redis_server.kill()
    redis_server.start()
    # Functions and lease state are both gone: the library is loaded again, the missing
    # incarnation marker makes the authority rebuild from the ledger, and the lease held
    # before the loss still refuses another principal.
    with pytest.raises(ConflictError):
        _baton(auth, principal="agent-b").leases.acquire("db", "orders", ttl_seconds=30)
    assert _libraries(redis_server.url) == [library().name]
    assert b.leases.release(first).status == "released"


def test_refused_functions_fall_back_to_scripts(
    redis_server: RedisServer, make_authority: Callable[..., RedisAuthority]
) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    admin.acl_setuser(
        "nofunctions",
        enabled=True,
        passwords=["+secret"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-fcall", "-fcall_ro", "-function"],
    )
    admin.close()
    url = f"redis://nofunctions:secret@127.0.0.1:{redis_server.port}/0"
    auth = RedisAuthority(connect(url), make_authority().store, ack="ledger", owns_client=True)
    try:
        b = _baton(auth)
        lease = b.leases.acquire("db", "orders", ttl_seconds=30)
        assert auth.scripts.functions is False
        assert _libraries(redis_server.url) == []
        assert b.leases.release(lease).status == "released"
    finally:
        auth.close()


def test_scripts_and_functions_share_one_state(
    redis_server: RedisServer, make_authority: Callable[..., RedisAuthority]
) -> None:
    """A client running scripts (an older version, or functions refused) and one running
    the library work on the same leases: a rolling upgrade changes nothing."""
    with_functions = make_authority()
    with_scripts = make_authority(functions=False)
    a = _baton(with_functions)
    lease = a.leases.acquire("db", "orders", ttl_seconds=30)
    with pytest.raises(ConflictError):
        _baton(with_scripts, principal="agent-b").leases.acquire("db", "orders", ttl_seconds=30)
    released = _baton(with_scripts).leases.release(lease)
    assert released.status == "released"
    assert with_scripts.scripts.functions is False
    again = _baton(with_scripts, principal="agent-b").leases.acquire("db", "orders", ttl_seconds=30)
    assert again.epoch > lease.epoch
    with_functions.reconciler.drain("org-fn")
    _rows, transitions = with_functions.store.lease_history("org-fn")
    assert [t.action for t in transitions] == ["acquire", "release", "acquire"]


@pytest.mark.parametrize("functions", [True, False])
def test_operations_without_hiredis(
    make_authority: Callable[..., RedisAuthority],
    monkeypatch: pytest.MonkeyPatch,
    functions: bool,
) -> None:
    """Without hiredis the commands are packed by redis-py's own packer, with the same
    results."""
    from prefect_baton._stores.redis import connection

    monkeypatch.setattr(connection, "_pack", None)
    auth = make_authority(functions=functions)
    b = _baton(auth)
    leases = b.leases.acquire_many([("db", "a"), ("db", "b")], ttl_seconds=30)
    assert [x.resource_id for x in leases] == ["a", "b"]
    assert auth.scripts.functions is functions
    assert all(b.leases.release(x).status == "released" for x in leases)


def test_each_thread_uses_its_own_connection(
    redis_server: RedisServer, make_authority: Callable[..., RedisAuthority]
) -> None:
    """The direct call path keeps one connection per thread: concurrent threads never
    read each other's replies, and close() disconnects them all."""
    import threading

    auth = make_authority()
    errors: list[BaseException] = []
    seen: list[object] = []

    def work(n: int) -> None:
        try:
            b = _baton(auth, principal=f"agent-{n}")
            for i in range(30):
                lease = b.leases.acquire("db", f"t{n}-{i % 3}", ttl_seconds=30)
                assert lease.owner == f"agent-{n}"
                assert lease.resource_id == f"t{n}-{i % 3}"
                assert b.leases.release(lease).status == "released"
            assert auth._pool is not None
            seen.append(auth._pool.get())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len({id(c) for c in seen}) == 6
    assert auth._pool is not None
    auth._pool.close()
    assert all(not c.is_connected for c in seen)  # type: ignore[attr-defined]


def test_a_forked_child_makes_its_own_connection(
    make_authority: Callable[..., RedisAuthority],
) -> None:
    import os

    auth = make_authority(ack="ledger")
    b = _baton(auth)
    lease = b.leases.acquire("db", "parent", ttl_seconds=30)
    pid = os.fork()
    if pid == 0:  # the child: its own connection, then a clean exit code
        code = 1
        try:
            child = b.leases.acquire("db", "child", ttl_seconds=30)
            code = 0 if b.leases.release(child).status == "released" else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's connection was not disturbed by the child's use.
    assert b.leases.release(lease).status == "released"


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
def test_retired_generations_are_pruned_as_fast_as_they_come(
    make_authority: Callable[..., RedisAuthority], functions: bool
) -> None:
    """Under a steady acquire/release load every acquire retires the previous generation;
    once older than the retention they are pruned faster than they come, so `old` stays
    small (it grew by about one per two acquires when each pruning removed four)."""
    from prefect_baton._stores.redis.keys import org_keys

    auth = make_authority(functions=functions, reconcile_in_client=False)
    b = _baton(auth, org="org-prune")
    keys = org_keys("org-prune")
    b.leases.release(b.leases.acquire("db", "r0", ttl_seconds=30))
    auth.client.hset(keys.base.inc, "ret", "1")  # retention 1 ms: every retired one is due
    for i in range(800):
        b.leases.release(b.leases.acquire("db", f"r{i % 10}", ttl_seconds=30))
    old, lid = keys.base[3], keys.base[2]
    assert auth.client.hlen(old) < 100
    assert auth.client.zcard(keys.base[4]) == auth.client.hlen(old)
    assert auth.client.hlen(lid) < 120  # the ten heads and the old ones not pruned yet


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
def test_marker_and_lease_id_index_are_hash_tables(
    make_authority: Callable[..., RedisAuthority], functions: bool
) -> None:
    """`inc` and `lid` are read on every call: they are kept as hash tables (a lookup)
    rather than listpacks (a scan of up to 512 entries), from the first rebuild on, and the
    padding field changes no result (release by a lease id, pruning, inspect)."""
    from prefect_baton._stores.redis.keys import org_keys

    auth = make_authority(functions=functions, reconcile_in_client=False)
    b = _baton(auth, org="org-enc")
    keys = org_keys("org-enc")
    leases = [b.leases.acquire("db", f"r{i}", ttl_seconds=30) for i in range(3)]
    for k in (keys.base.inc, keys.base[2]):
        assert auth.client.object("encoding", k) == b"hashtable"
    assert auth.client.hlen(keys.base[2]) == 4  # three lease ids and the padding
    assert b.leases.release(leases[0]).status == "released"
    assert b.leases.release_by_id(leases[1].lease_id).status == "released"
    assert b.leases.inspect("db", "r2").lease == leases[2]


def test_a_library_flushed_at_every_attempt_is_unavailable_and_runs_nothing(
    redis_server: RedisServer,
    make_authority: Callable[..., RedisAuthority],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FUNCTION FLUSH right before every FCALL: the call gives up with UNAVAILABLE (the
    operation never ran, a retry is safe); one flush is absorbed by loading again."""
    from prefect_baton._stores.redis import connection
    from prefect_baton.errors import UnavailableError

    auth = make_authority(ack="ledger")
    b = _baton(auth)
    b.leases.release(b.leases.acquire("db", "warm", ttl_seconds=30))
    admin = redis.Redis.from_url(redis_server.url)
    send = connection._send
    flushes = {"left": 0}

    def flushing_send(conn: object, *args: object) -> None:
        if args[0] == "FCALL" and flushes["left"]:
            flushes["left"] -= 1
            admin.function_flush()
        send(conn, *args)

    monkeypatch.setattr(connection, "_send", flushing_send)
    flushes["left"] = 1000
    with pytest.raises(UnavailableError):
        b.leases.acquire("db", "orders", ttl_seconds=30)
    flushes["left"] = 0
    assert not b.leases.inspect("db", "orders").held
    flushes["left"] = 1
    lease = b.leases.acquire("db", "orders", ttl_seconds=30)
    assert auth.scripts.functions is True
    assert b.leases.release(lease).status == "released"
    admin.close()


def test_a_script_cache_flushed_during_the_call_is_unavailable(
    redis_server: RedisServer,
    make_authority: Callable[..., RedisAuthority],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the scripts path, SCRIPT FLUSH between redis-py's reload and its second EVALSHA:
    UNAVAILABLE (nothing ran), not a generic error."""
    from prefect_baton.errors import UnavailableError

    auth = make_authority(ack="ledger", functions=False)
    b = _baton(auth)
    admin = redis.Redis.from_url(redis_server.url)
    admin.script_flush()
    load = redis.Redis.script_load

    def load_then_flush(self: redis.Redis, script: str) -> str:
        sha: str = load(self, script)
        admin.script_flush()
        return sha

    monkeypatch.setattr(redis.Redis, "script_load", load_then_flush)
    with pytest.raises(UnavailableError):
        b.leases.acquire("db", "orders", ttl_seconds=30)
    monkeypatch.setattr(redis.Redis, "script_load", load)
    assert not b.leases.inspect("db", "orders").held
    assert b.leases.acquire("db", "orders", ttl_seconds=30).status == "active"
    admin.close()


def test_out_of_memory_does_not_turn_functions_off(
    redis_server: RedisServer, make_authority: Callable[..., RedisAuthority]
) -> None:
    """An error that would refuse the script too (here: out of memory while loading the
    library) is UNAVAILABLE for that call; the library is used again afterwards."""
    from prefect_baton.errors import UnavailableError

    auth = make_authority(ack="ledger")
    b = _baton(auth)
    b.leases.release(b.leases.acquire("db", "warm", ttl_seconds=30))
    admin = redis.Redis.from_url(redis_server.url)
    admin.function_flush()
    admin.config_set("maxmemory", "1")
    try:
        with pytest.raises(UnavailableError):
            b.leases.acquire("db", "orders", ttl_seconds=30)
    finally:
        admin.config_set("maxmemory", "0")
    lease = b.leases.acquire("db", "orders", ttl_seconds=30)
    assert auth.scripts.functions is True
    assert _libraries(redis_server.url) == [library().name]
    assert b.leases.release(lease).status == "released"
    admin.close()


def test_connections_of_finished_threads_are_closed(
    make_authority: Callable[..., RedisAuthority],
) -> None:
    """Threads that come and go do not leave sockets open until a garbage collection."""
    import gc
    import threading

    auth = make_authority(ack="ledger")
    b = _baton(auth)
    b.leases.inspect("db", "warm")
    pool = auth._pool
    assert pool is not None
    gc.disable()
    try:
        for n in range(40):
            t = threading.Thread(target=b.leases.inspect, args=("db", f"t{n}"))
            t.start()
            t.join()
        connected = [c for c in list(pool._all) if c.is_connected]
    finally:
        gc.enable()
    # this thread's and the last finished thread's (closed when the next one starts)
    assert len(connected) <= 2


def test_a_connection_the_server_dropped_is_replaced_before_the_next_command(
    redis_server: RedisServer, make_authority: Callable[..., RedisAuthority]
) -> None:
    """CLIENT KILL (or a server timeout) closes this thread's connection between two calls:
    the next call is sent on a new connection and succeeds, it does not fail UNAVAILABLE
    with an unknown outcome. An open TCP connection is reused without the readiness poll
    (a blocking system call that hands the GIL to the process's other threads)."""
    auth = make_authority(ack="ledger")
    b = _baton(auth)
    lease = b.leases.acquire("db", "orders", ttl_seconds=30)
    pool = auth._pool
    assert pool is not None
    conn = pool.get()

    def no_poll() -> bool:
        raise AssertionError("an open connection was polled before its command")

    conn.can_read = no_poll
    lease = b.leases.renew(lease, ttl_seconds=30)
    del conn.can_read

    conn.send_command("CLIENT", "ID")
    own_id = conn.read_response()
    admin = redis.Redis.from_url(redis_server.url)
    try:
        assert admin.client_kill_filter(_id=own_id) == 1
    finally:
        admin.close()
    renewed = b.leases.renew(lease, ttl_seconds=30)
    assert renewed.version == lease.version + 1
    assert b.leases.release(renewed).status == "released"
