"""The fencing rule, the token of a lease, and its HTTP headers (no database)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from prefect_baton import StaleFenceError, ValidationError
from prefect_baton._rules.core import check_fencing_token
from prefect_baton.fencing import (
    RESOURCE_HEADER,
    TOKEN_HEADER,
    FencingToken,
    headers,
    token_from_headers,
)
from prefect_baton.testing import ManualClock, memory_baton


def test_rule_equal_passes_lower_fails_higher_rises() -> None:
    """The one rule: no token seen or an equal one passes, a higher rises, a lower fails."""
    assert check_fencing_token(None, 4, resource="r") == 4
    assert check_fencing_token(4, 4, resource="r") == 4
    assert check_fencing_token(4, 9, resource="r") == 9
    with pytest.raises(StaleFenceError, match="token 3 of r is stale: token 4"):
        check_fencing_token(4, 3, resource="r")


def test_token_of_a_lease_and_of_its_block() -> None:
    """A Lease and the lease block give their resource and epoch as the token."""
    with memory_baton(clock=ManualClock()) as b:
        lease = b.leases.acquire("deploy", "checkout/eu", ttl_seconds=60)
        assert FencingToken.of(lease) == FencingToken("deploy", "checkout/eu", lease.epoch)
        with b.lease("deploy", "other", ttl_seconds=60) as block:
            assert FencingToken.of(block) == FencingToken("deploy", "other", block.epoch)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("deploy", "svc", -1), "from 0 to"),
        (("deploy", "svc", 2**53), "from 0 to"),
        (("deploy", "svc", True), "must be an integer"),
        (("deploy", "svc", "7"), "must be an integer"),
        (("deploy", "svc", 7.0), "must be an integer"),
        (("deploy", "svc", None), "must be an integer"),
        (("", "svc", 7), "resource_type must not be empty"),
        (("deploy", "x" * 257, 7), "at most 256"),
        (("deploy", "a\nb", 7), "control characters"),
    ],
)
def test_bad_tokens_are_validation_errors(args: tuple[object, ...], message: str) -> None:
    """A negative, too large or non-integer epoch, or a bad resource, is VALIDATION_ERROR."""
    with pytest.raises(ValidationError, match=message):
        FencingToken(*args)  # type: ignore[arg-type]


def test_not_a_fence() -> None:
    """Something without resource and epoch is refused with a clear message."""
    with pytest.raises(ValidationError, match="a fence must be a Lease"):
        FencingToken.of(object())  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="a fence must be a Lease"):
        headers("lease_123")  # type: ignore[arg-type]


def test_headers_round_trip_with_awkward_ids() -> None:
    """The headers of a token give the same token back, even with '/', '%' or non-ASCII."""
    token = FencingToken("deploy/x", "eu/checkout %2F ü", 2**53 - 1)
    sent = headers(token)
    assert sent[TOKEN_HEADER] == str(2**53 - 1)
    assert sent[RESOURCE_HEADER].isascii()
    assert sent[RESOURCE_HEADER].count("/") == 1
    lowered = {k.lower(): v for k, v in sent.items()}
    assert token_from_headers(lowered, "deploy/x", "eu/checkout %2F ü") == token


def test_epoch_only_header_takes_the_route_resource() -> None:
    """Without the resource header, the token is the server's resource at that epoch."""
    assert token_from_headers({TOKEN_HEADER: " 12 "}, "deploy", "svc") == FencingToken(
        "deploy", "svc", 12
    )


@pytest.mark.parametrize(
    ("received", "message"),
    [
        ({}, "header is missing"),
        ({RESOURCE_HEADER: "deploy/svc"}, "header is missing"),
        ({TOKEN_HEADER: ""}, "must be a decimal integer"),
        ({TOKEN_HEADER: "-1"}, "must be a decimal integer"),
        ({TOKEN_HEADER: "+1"}, "must be a decimal integer"),
        ({TOKEN_HEADER: "1.5"}, "must be a decimal integer"),
        ({TOKEN_HEADER: "0x10"}, "must be a decimal integer"),
        ({TOKEN_HEADER: "7, 8"}, "must be a decimal integer"),
        ({TOKEN_HEADER: "٣"}, "must be a decimal integer"),
        ({TOKEN_HEADER: "9" * 17}, "must be a decimal integer"),
        ({TOKEN_HEADER: str(2**53)}, "from 0 to"),
        ({TOKEN_HEADER: "7", RESOURCE_HEADER: "deploy"}, "<resource_type>/<resource_id>"),
        ({TOKEN_HEADER: "7", RESOURCE_HEADER: "a/b/c"}, "<resource_type>/<resource_id>"),
        ({TOKEN_HEADER: "7", RESOURCE_HEADER: "deploy/%ff"}, "not UTF-8"),
        ({TOKEN_HEADER: "7", RESOURCE_HEADER: "deploy/"}, "resource_id must not be empty"),
    ],
)
def test_bad_headers_are_validation_errors(received: dict[str, str], message: str) -> None:
    """A missing, malformed or out-of-range header is VALIDATION_ERROR, saying why."""
    with pytest.raises(ValidationError, match=message):
        token_from_headers(received, "deploy", "svc")


def test_header_sent_twice_is_refused() -> None:
    """Two token headers (as a Starlette request can carry) are ambiguous: VALIDATION_ERROR."""
    from starlette.datastructures import Headers

    twice = Headers(raw=[(b"baton-fencing-token", b"7"), (b"Baton-Fencing-Token", b"8")])
    with pytest.raises(ValidationError, match="sent 2 times"):
        token_from_headers(twice, "deploy", "svc")


def test_token_of_another_resource_is_stale() -> None:
    """A token whose resource header names another resource cannot fence this write."""
    sent = headers(FencingToken("deploy", "billing", 9))
    with pytest.raises(StaleFenceError, match="is for resource deploy/billing, not deploy/svc"):
        token_from_headers(sent, "deploy", "svc")


def test_import_is_light() -> None:
    """Importing prefect_baton.fencing loads no Redis, Prefect, FastAPI or HTTP client."""
    code = (
        "import sys, prefect_baton.fencing\n"
        "heavy = ('redis', 'prefect', 'fastapi', 'starlette', 'httpx', 'uvicorn')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
