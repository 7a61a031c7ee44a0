"""The live page in a real browser: Debian's Chromium, headless, driven by Selenium through
Debian's chromedriver, against the REST API served by uvicorn on a free loopback port over
a SQLite ledger. The page signs in with a bearer key and shows what that key may see over
REST: leases (holder, purpose and scopes only of one's own, or to an owner), their expiry
counting down, pending handoffs (an agent's inbox and what it sent; every pending handoff
of the org to an owner), and nothing of another organization.

Without Chromium the test is skipped, and fails with ``BATON_REQUIRE_SERVICES=1`` (CI)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from prefect_baton import Baton
from prefect_baton.rest import create_key
from tests.conftest import REQUIRE

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
)
WAIT = 15.0  # seconds a page change may take to show (polls every 2 s)


def _missing(what: str) -> None:
    msg = f"{what} is not installed (apt-get install -y chromium chromium-driver)"
    if REQUIRE:
        pytest.fail(msg + " (BATON_REQUIRE_SERVICES=1)")
    pytest.skip(msg)


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    """A headless Chromium under Selenium (Debian's browser and driver, nothing fetched)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            _missing(path)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium (the dev extra)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ARGS:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def served(rest_api: str, sqlite_url: str) -> tuple[str, str]:
    """``(base URL, ledger URL)`` of the session's REST API (uvicorn in a thread on a free
    loopback port over a SQLite ledger, ``tests/conftest.py``)."""
    return rest_api, sqlite_url


@pytest.fixture
def orgs() -> tuple[str, str]:
    """Two fresh organization ids (the served ledger is the session's)."""
    tag = uuid.uuid4().hex[:8]
    return f"acme-{tag}", f"rival-{tag}"


def _wait(driver: Any, what: str, check: Callable[[], Any]) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def probe(_d: Any) -> Any:
        try:
            return check()
        except StaleElementReferenceException:  # the table was redrawn under us
            return None

    try:
        return WebDriverWait(driver, WAIT, poll_frequency=0.1).until(probe)
    except Exception as exc:
        text = driver.find_element("tag name", "body").text
        raise AssertionError(f"{what}; the page shows:\n{text}") from exc


def _row(driver: Any, table: str, attr: str, value: str) -> list[Any]:
    return list(driver.find_elements("css selector", f'#{table} tbody tr[data-{attr}="{value}"]'))


def _cells(driver: Any, resource: str) -> dict[str, str]:
    (tr,) = _row(driver, "leases", "resource", resource)
    out: dict[str, str] = {}
    for td in tr.find_elements("css selector", "td"):
        for cls in ("holder", "purpose", "scopes", "epoch", "expires"):
            if cls in (td.get_attribute("class") or "").split():
                out[cls] = td.text
    return out


def _sign_in(driver: Any, base: str, secret: str) -> None:
    driver.get(base + "/ui")
    _wait(driver, "the sign-in form shows", lambda: driver.find_element("id", "key").is_displayed())
    driver.find_element("id", "key").send_keys(secret)
    driver.find_element("css selector", "#signin-form button").click()
    _wait(driver, "the board shows", lambda: driver.find_element("id", "board").is_displayed())


def test_live_page(driver: Any, served: tuple[str, str], orgs: tuple[str, str]) -> None:
    base, ledger = served
    acme, rival = orgs
    alice_key, _ = create_key(ledger, org=acme, principal="alice", role="agent")
    owner_key, _ = create_key(ledger, org=acme, principal="boss", role="owner")
    alice = Baton(ledger_url=ledger, org=acme, principal="alice")
    bob = alice.as_principal("bob")
    eve = Baton(ledger_url=ledger, org=rival, principal="intruder-eve")
    try:
        eve_lease = eve.leases.acquire("deploy", "eve-service", ttl_seconds=600, purpose="eve-job")
        eve.handoffs.create("mallory", "eve-subject", message="eve-message")
        bob_lease = bob.leases.acquire(
            "deploy", "bob-service", ttl_seconds=600, purpose="bob-secret-purpose"
        )
        mine = alice.leases.acquire(
            "deploy", "alice-service", ttl_seconds=600, purpose="rollback", scopes=["db:*"]
        )

        _sign_in(driver, base, alice_key)
        who = driver.find_element("id", "who").text
        assert who == f"alice (agent) in {acme}"

        # alice's own lease in full; bob's without holder, purpose or scopes
        _wait(driver, "both leases show", lambda: len(_row(driver, "leases", "type", "deploy")) > 1)
        own = _cells(driver, "deploy/alice-service")
        assert own["holder"] == "alice"
        assert own["purpose"] == "rollback"
        assert own["scopes"] == "db:*"
        assert own["epoch"] == str(mine.epoch)
        other = _cells(driver, "deploy/bob-service")
        assert other["holder"] == other["purpose"] == other["scopes"] == "hidden"
        assert other["epoch"] == str(bob_lease.epoch)

        # the expiry counts down in the browser
        def seconds_left() -> float:
            return float(_cells(driver, "deploy/alice-service")["expires"].removesuffix(" s"))

        first = _wait(driver, "the expiry shows", seconds_left)
        assert 0 < first <= 600
        _wait(driver, "the expiry counts down", lambda: seconds_left() <= first - 1.0)

        # a release takes the row away
        alice.leases.release(mine)
        _wait(
            driver,
            "the released lease goes",
            lambda: not _row(driver, "leases", "resource", "deploy/alice-service"),
        )

        # a handoff to alice shows until she accepts it; one between bob and carol does not
        # show to her (an agent key sees its inbox and what it sent)
        between = bob.handoffs.create("carol", "bob-to-carol", message="for-carol-only")
        handoff = bob.handoffs.create("alice", "report-7", message="please review")
        _wait(
            driver,
            "the pending handoff shows",
            lambda: _row(driver, "handoffs", "handoff", handoff.handoff_id),
        )
        assert not _row(driver, "handoffs", "handoff", between.handoff_id)
        assert "for-carol-only" not in driver.page_source
        alice.handoffs.resolve(handoff.handoff_id, "accepted")
        _wait(
            driver,
            "the accepted handoff goes",
            lambda: not _row(driver, "handoffs", "handoff", handoff.handoff_id),
        )
        _wait(
            driver,
            "the event stream shows the acceptance",
            lambda: _row(driver, "events", "kind", "handoff.accepted"),
        )
        assert driver.find_element("id", "lag").text == "none: the ledger is the lease authority"

        # nothing of the other org, nor bob's purpose, anywhere in the page
        source = driver.page_source
        others = ("intruder-eve", "eve-service", "eve-job", "eve-subject", "eve-message")
        for secret in (*others, rival, "mallory", eve_lease.lease_id, "bob-secret-purpose"):
            assert secret not in source, secret

        # an owner of the org sees bob's holder and purpose, still nothing of the other org
        driver.find_element("id", "signout").click()
        _sign_in(driver, base, owner_key)
        _wait(
            driver,
            "the owner sees bob's lease",
            lambda: _row(driver, "leases", "resource", "deploy/bob-service"),
        )
        seen = _cells(driver, "deploy/bob-service")
        assert seen["holder"] == "bob"
        assert seen["purpose"] == "bob-secret-purpose"
        # ... and every pending handoff of the org, the one between bob and carol included
        # (GET /v1/handoffs?party=*), but not the accepted one
        (row,) = _wait(
            driver,
            "the owner sees the handoff between bob and carol",
            lambda: _row(driver, "handoffs", "handoff", between.handoff_id),
        )
        texts = [td.text for td in row.find_elements("css selector", "td")]
        assert texts[1:4] == ["bob", "carol", "bob-to-carol"]
        assert texts[-1] == "for-carol-only"
        assert not _row(driver, "handoffs", "handoff", handoff.handoff_id)
        assert driver.find_element("id", "handoff-count").text == "(1)"
        assert not [s for s in (*others, rival) if s in driver.page_source]

        # a click on a lease row shows the resource's timeline picture
        _row(driver, "leases", "resource", "deploy/bob-service")[0].click()
        _wait(
            driver,
            "the timeline picture loads",
            lambda: driver.execute_script(
                "const i = document.getElementById('timeline-img');"
                "return i.complete && i.naturalWidth > 0;"
            ),
        )
        assert driver.find_element("id", "timeline-resource").text == "deploy/bob-service"
        assert driver.find_element("id", "timeline-error").text == ""

        # the page ran under its Content-Security-Policy without a violation
        logs = driver.get_log("browser")
        assert not [e for e in logs if "Content Security Policy" in e.get("message", "")], logs
    finally:
        for client in (alice, bob, eve):
            client.close()


def test_a_refused_key_stays_signed_out(driver: Any, served: tuple[str, str]) -> None:
    base, _ledger = served
    driver.get(base + "/ui")
    driver.execute_script("sessionStorage.clear()")
    driver.get(base + "/ui")
    driver.find_element("id", "key").send_keys("bk_" + "x" * 43)
    driver.find_element("css selector", "#signin-form button").click()
    message = _wait(
        driver,
        "the refusal shows",
        lambda: driver.find_element("id", "signin-error").text,
    )
    assert "refused" in message
    assert not driver.find_element("id", "board").is_displayed()


def test_a_section_the_key_may_not_read_leaves_the_others(
    driver: Any, served: tuple[str, str], orgs: tuple[str, str]
) -> None:
    base, ledger = served
    acme = orgs[0]
    scopes = ["leases:read", "handoffs:read"]
    secret, _ = create_key(ledger, org=acme, principal="dave", role="agent", scopes=scopes)
    dave = Baton(ledger_url=ledger, org=acme, principal="dave")
    try:
        dave.leases.acquire("deploy", "dave-service", ttl_seconds=600)
        driver.get(base + "/ui")
        driver.execute_script("sessionStorage.clear()")
        _sign_in(driver, base, secret)
        _wait(
            driver,
            "the lease shows",
            lambda: _row(driver, "leases", "resource", "deploy/dave-service"),
        )
        status = _wait(driver, "the status names the failure", lambda: _status(driver))
        assert "events:read" in status
        assert not driver.find_elements("css selector", "#events tbody tr")
    finally:
        dave.close()


def _status(driver: Any) -> str | None:
    text: str = driver.find_element("id", "status").text
    return text if text.startswith("update failed") else None
