"""The rule deciding whether an org's Redis state belongs to the caller's ledger
(``prefect_baton._rules.core.check_org_ledger``): the ledger id in the org's incarnation
marker against the one the caller's ledger recorded with the org's incarnation."""

from __future__ import annotations

import pytest

from prefect_baton._rules.core import check_org_ledger
from prefect_baton.errors import ValidationError


@pytest.mark.parametrize(
    ("marker", "ours"),
    [
        (None, None),  # no marker, or one of an earlier version: unknown, accepted
        (None, "a1"),
        ("a1", "a1"),
    ],
)
def test_the_same_or_an_unknown_ledger_passes(marker: str | None, ours: str | None) -> None:
    check_org_ledger("acme", marker, ours, "the Redis at h:6379/12")


@pytest.mark.parametrize("ours", ["b2", None])
def test_another_ledger_is_refused_naming_the_org_and_the_redis(ours: str | None) -> None:
    """Another id, or none at all (the caller's ledger never built the org's Redis
    state): refused."""
    with pytest.raises(
        ValidationError,
        match=r"org 'acme' in the Redis at h:6379/12 belongs to another ledger.*BATON_LEDGER_URL",
    ) as exc:
        check_org_ledger("acme", "a1", ours, "the Redis at h:6379/12")
    assert exc.value.code == "VALIDATION_ERROR"
