"""``baton ui``: the live page on a free loopback port over the ledger, with an owner key
made for the session, printed once and revoked when the command is stopped; a browser is
started only with ``--open``."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from prefect_baton.rest.keys import list_keys

from .conftest import BATON_SCRIPT, Cli, process_env

URL = re.compile(r"^baton ui: (http://127\.0\.0\.1:(\d+)/ui)$")


def _start(cli: Cli, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """``baton --ledger-url L --org O --principal carol ARGS`` (``ARGS`` holding ``ui``),
    with ``$BROWSER`` a script that writes the URL it is given to a file."""
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\nprintf "%s" "$1" > {tmp_path / "opened"}\n')
    browser.chmod(0o755)
    argv = [str(BATON_SCRIPT), "--ledger-url", cli.ledger_url, "--org", cli.org]
    argv += ["--principal", "carol", *args]
    env = {**process_env(), "BROWSER": f"{browser} %s", "BATON_KEY_CACHE_SECONDS": "0"}
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )


def _wait_for_page(url: str, proc: subprocess.Popen[str]) -> httpx.Response:
    pause = threading.Event()
    for _ in range(3000):
        assert proc.poll() is None, "baton ui exited"
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:
            pause.wait(0.02)
    raise AssertionError("baton ui did not start serving")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_ui_serves_the_page_with_a_session_key_revoked_on_stop(
    cli: Cli, tmp_path: Path, stop: signal.Signals
) -> None:
    proc = _start(cli, tmp_path, "ui")
    assert proc.stdout is not None
    lines = [proc.stdout.readline().rstrip("\n") for _ in range(4)]
    try:
        match = URL.match(lines[0])
        assert match, lines
        url = match.group(1)
        secret = lines[1].rsplit(" ", 1)[1]
        assert secret.startswith("bk_")
        assert lines[2].endswith(f"{url}#key={secret}")
        page = _wait_for_page(url, proc)
        assert page.status_code == 200
        assert "Content-Security-Policy" in page.headers
        me = httpx.get(url[: -len("/ui")] + "/v1/me", headers={"Authorization": f"Bearer {secret}"})
        assert me.json()["data"]["org"] == cli.org
        assert me.json()["data"]["principal"] == "carol"
        assert me.json()["data"]["role"] == "owner"
        assert not (tmp_path / "opened").exists()  # no --open: no browser
    finally:
        proc.send_signal(stop)
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    (key,) = list_keys(cli.ledger_url, org=cli.org, include_revoked=True)
    assert key.principal == "carol"
    assert key.revoked_at_ms is not None


def test_ui_open_hands_the_signed_in_url_to_the_browser(cli: Cli, tmp_path: Path) -> None:
    """With --format json the first line is a receipt naming the page and the key; --open
    gives the signed-in URL to the browser ($BROWSER here)."""
    proc = _start(cli, tmp_path, "--format", "json", "ui", "--role", "agent", "--open")
    assert proc.stdout is not None
    try:
        receipt = json.loads(proc.stdout.readline())
        assert receipt["ok"] is True
        assert receipt["action"] == "ui"
        page = receipt["ui"]
        assert URL.match("baton ui: " + page["url"])
        assert page["signed_in_url"] == f"{page['url']}#key={receipt['secret']}"
        assert (page["org"], page["principal"], page["role"]) == (cli.org, "carol", "agent")
        assert _wait_for_page(page["url"], proc).status_code == 200
        opened = tmp_path / "opened"
        pause = threading.Event()
        for _ in range(500):
            if opened.exists() and opened.read_text():
                break
            pause.wait(0.02)
        assert opened.read_text() == page["signed_in_url"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    (key,) = list_keys(cli.ledger_url, org=cli.org, include_revoked=True)
    assert key.key_id == page["key_id"]
    assert key.revoked_at_ms is not None
