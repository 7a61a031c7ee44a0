"""The rule deciding whether a client's Redis server is the one the ledger records as deciding
an org's leases (``prefect_baton._rules.core.check_org_redis``), used by the rebuild after a
loss and by the hand-back to the ledger."""

from __future__ import annotations

import pytest

from prefect_baton._rules.core import check_org_redis
from prefect_baton.errors import ForbiddenError


@pytest.mark.parametrize("hand_back", [False, True])
@pytest.mark.parametrize(
    ("recorded", "here"),
    [
        (None, None),
        (None, "h:6379/0"),
        ("h:6379/0", None),
        ("h:6379/0", "h:6379/0"),
    ],
)
def test_same_or_unknown_server_passes(
    recorded: str | None, here: str | None, hand_back: bool
) -> None:
    check_org_redis("o", recorded, here, hand_back=hand_back)


def test_other_server_is_refused_with_the_remedy() -> None:
    with pytest.raises(
        ForbiddenError,
        match=r"decided by the Redis at h:6379/0 and this client's Redis \(h:6379/1\) has no state"
        r".*BATON_REDIS_URL.*--return-to-ledger",
    ) as exc:
        check_org_redis("o", "h:6379/0", "h:6379/1", hand_back=False)
    assert exc.value.code == "FORBIDDEN"
    with pytest.raises(
        ForbiddenError,
        match=r"decided by the Redis at h:6379/0, not this one \(h:6379/1\).*--force",
    ):
        check_org_redis("o", "h:6379/0", "h:6379/1", hand_back=True)
