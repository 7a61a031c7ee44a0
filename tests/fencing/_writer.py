"""A writer of the concurrency tests: fenced writes to the user's own tables.

As a process: ``python -m tests.fencing._writer '<json config>'`` (from the repository
root) makes ``config["writes"]`` fenced writes with the tokens ``config["tokens"]`` and
prints one JSON line ``{"landed": [...], "refused": [...]}`` (the tokens of each).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Table, create_engine, insert, update

from prefect_baton.errors import StaleFenceError
from prefect_baton.fencing import FencingToken, guard


def fenced_write(
    engine: Engine,
    tables: tuple[Table, Table],
    *,
    namespace: str,
    service: str,
    token: int,
    writer: str,
) -> bool:
    """One write of ``writer`` under ``token``, guarded: ``True`` if it landed, ``False``
    if the guard refused it (nothing written then)."""
    deploys, writes = tables
    try:
        with engine.begin() as conn:
            guard(conn, FencingToken("deploy", service, token), namespace=namespace)
            conn.execute(insert(writes).values(token=token, writer=writer))
            conn.execute(
                update(deploys)
                .where(deploys.c.service == service)
                .values(version=f"{writer}@{token}")
            )
    except StaleFenceError:
        return False
    return True


def main() -> None:
    from tests.fencing.conftest import user_tables

    cfg: dict[str, Any] = json.loads(sys.argv[1])
    _, deploys, writes = user_tables(cfg["suffix"])
    connect_args = {"timeout": 60} if cfg["url"].startswith("sqlite") else {}
    engine = create_engine(cfg["url"], connect_args=connect_args)
    barrier = Path(cfg["barrier_dir"])
    (barrier / f"ready-{cfg['writer']}").touch()
    deadline = time.monotonic() + 120
    while not (barrier / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("never got the go signal")
        time.sleep(0.005)
    landed, refused = [], []
    for token in cfg["tokens"]:
        ok = fenced_write(
            engine,
            (deploys, writes),
            namespace=cfg["namespace"],
            service=cfg["service"],
            token=token,
            writer=cfg["writer"],
        )
        (landed if ok else refused).append(token)
    engine.dispose()
    print(json.dumps({"landed": landed, "refused": refused}))


if __name__ == "__main__":
    main()
