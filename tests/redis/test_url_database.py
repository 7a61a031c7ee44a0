"""The Redis URL's database, written as the path and the ``db`` query together, is used when
both agree (on the real server of ``BATON_TEST_REDIS_URL``, its own database only); the
refusals of a database part that would silently mean another database are in
``tests/unit/test_redis_url_db.py``."""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import urlsplit

from prefect_baton import Baton
from prefect_baton._stores.redis.keys import org_keys
from redis import Redis
from tests.conftest import REDIS_URL, require_redis


def test_a_path_and_query_naming_one_database_use_it(tmp_path: Path) -> None:
    require_redis()
    db = int(urlsplit(REDIS_URL).path.strip("/") or 0)
    url = f"{REDIS_URL.split('?')[0]}?db={db}"
    org = f"urldb-{uuid.uuid4().hex[:8]}"
    b = Baton(ledger_url=f"sqlite:///{tmp_path / 'l.db'}", org=org, principal="a", redis_url=url)
    direct = Redis.from_url(REDIS_URL)
    try:
        b.leases.acquire("deploy", "svc", ttl_seconds=30)
        assert b.leases.inspect("deploy", "svc").held
        assert direct.exists(org_keys(org).base[1])  # heads  # the org's state is in that database
    finally:
        b.close()
        direct.close()
