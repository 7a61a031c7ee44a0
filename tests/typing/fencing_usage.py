"""Correct use of the fencing guards: mypy --strict must accept it, with exact result types.

A :class:`Lease`, the lease block and a :class:`FencingToken` all satisfy ``Fenceable``."""

from __future__ import annotations

from typing import assert_type

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from prefect_baton import Baton, Lease
from prefect_baton.fencing import (
    FencingToken,
    StoredObject,
    conditional_put,
    guard,
    headers,
    highest_token,
    object_metadata,
    token_from_headers,
)


def sql(b: Baton, engine: Engine) -> None:
    lease = b.leases.acquire("deploy", "svc", ttl_seconds=60)
    with engine.begin() as conn:
        assert_type(guard(conn, lease), int)
        assert_type(highest_token(conn, "deploy", "svc"), int | None)
    with Session(engine) as session, b.lease("deploy", "svc", ttl_seconds=60) as held:
        assert_type(guard(session, held, namespace=b.org), int)


def http(lease: Lease) -> None:
    sent = headers(lease)
    assert_type(sent, dict[str, str])
    assert_type(token_from_headers(sent, "deploy", "svc"), FencingToken)


def objects(lease: Lease) -> None:
    def read() -> StoredObject[int]:
        return StoredObject(token=None, precondition=0)

    def write(generation: int) -> str:
        return f"{generation}:{object_metadata(lease)}"

    assert_type(conditional_put(lease, read, write), str)
    assert_type(conditional_put(FencingToken("deploy", "svc", 3), read, write), str)
