"""A Redis URL's database part never silently means another database: a path that is not
one integer (``/abc``), more than one path segment (``/10/x``), a ``db`` query that is not
an integer, and a path and ``db`` query that disagree (``/10?db=3``) are VALIDATION_ERROR
naming the URL part at fault (never the password), before any connection is made, instead
of redis-py's database 0 or its query overriding the path.

The URLs point at a port in this suite's range nobody listens on, so a client built despite
them (without the check) fails to connect rather than writing to a real Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_baton import Baton, ValidationError
from prefect_baton._stores.redis.connection import check_url

BASE = "redis://127.0.0.1:18199"

REFUSED = [
    (f"{BASE}/abc", r"the path '/abc' is not a database index"),
    (f"{BASE}/10/x", r"the path '/10/x' has more than one segment"),
    (f"{BASE}/10?db=3", r"the path names database 10 and the query db=3"),
    (f"{BASE}/?db=x", r"the query's db='x' is not a database index"),
    (f"{BASE}/?db=1&db=2", r"the query gives db more than once"),
    (f"{BASE}/-1", r"the path '/-1' is not a database index"),
    ("redis+cluster://127.0.0.1:18199/abc", r"the path '/abc' is not a database index"),
]

ACCEPTED = [
    BASE,
    f"{BASE}/",
    f"{BASE}/7",
    f"{BASE}/%37",
    f"{BASE}/7?db=7",
    f"{BASE}?db=7",
    f"{BASE}/?db=7&socket_timeout=1",
    "unix:///tmp/redis.sock?db=7",
    "unix:///tmp/redis.sock",
]


@pytest.mark.parametrize(("url", "message"), REFUSED)
def test_a_bad_database_part_is_refused(url: str, message: str) -> None:
    with pytest.raises(ValidationError, match=f"^bad Redis URL: {message}"):
        check_url(url)


@pytest.mark.parametrize("url", ACCEPTED)
def test_a_database_written_once_is_accepted(url: str) -> None:
    check_url(url)


@pytest.mark.parametrize(("url", "message"), REFUSED[:3])
def test_the_client_refuses_it_before_connecting(tmp_path: Path, url: str, message: str) -> None:
    """``Baton(redis_url=...)`` raises the VALIDATION_ERROR at once, before the ledger file
    is created (not redis-py's database 0, nor UNAVAILABLE from a connection attempt)."""
    ledger = tmp_path / "l.db"
    with pytest.raises(ValidationError, match=message) as raised:
        Baton(ledger_url=f"sqlite:///{ledger}", org="o", principal="a", redis_url=url)
    assert raised.value.code == "VALIDATION_ERROR"
    assert not ledger.exists()


def test_the_password_is_never_shown() -> None:
    """A password with an unescaped ``/`` lands in the path: the message does not show it."""
    with pytest.raises(ValidationError) as raised:
        check_url("redis://:s3cr/et-pw@127.0.0.1:18199/7")
    assert "et-pw" not in raised.value.message
    assert "s3cr" not in raised.value.message
    assert "not shown" in raised.value.message
    with pytest.raises(ValidationError) as raised:
        check_url("redis://user:s3cret@127.0.0.1:18199/abc")
    assert "s3cret" not in raised.value.message
