"""Every exchange of the seed service's documents runs against a real ``baton serve``.

The documents (files ``000_*`` and ``003_*`` of the seeds) are vendored, verbatim, under
``tests/rest/seed_docs/`` (each file names its source), so this runs on a fresh clone.
The test parses them: every ``curl`` command (with its ``-X``, ``-H`` and ``-d``) and
every documented response (a ```` ```json ```` block, or ``#`` comment lines holding
JSON). A curl is sent as written to ``baton serve`` started as a subprocess on a free
loopback port; only what a shell or the reader supplies is replaced: the base URL
``http://127.0.0.1:8787`` by the server's, ``$TITEN_API_KEY`` by a bearer key, and the
document's example checkpoint id by one this server gave (a handoff's checkpoint must
exist). A documented response without its own curl answers a request the prose names:
the ``CONFLICT`` is the previous curl sent by a second principal, the handoff list is
``GET /v1/handoffs`` by the recipient, the resolve refusal is
``POST /v1/handoffs/:id/resolve`` by the sender.

Each response is compared by status (the document's, where it gives one) and by shape:
every documented key is there with the same JSON type; ids keep their prefix; times are
the seed's millisecond ``Z`` form; every other documented value (codes, messages with
their times, statuses, names) is equal. Our replies may carry more keys (``meta``, the
full lease): ``docs/rest.md`` "Coming from the seed service" lists them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefect_baton.rest.keys import create_key

DOCS = Path(__file__).parent / "seed_docs"
BATON = str(Path(sys.executable).parent / "baton")
SEED_BASE = "http://127.0.0.1:8787"
TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
ID = re.compile(r"(lease|hoff|ckpt)_[0-9a-f]{32}")
#: The principal the documents show as a handoff's sender.
SENDER = "agent_8df7b8699a0945488ceb3d4b104006d6"


@dataclass
class Curl:
    """A curl command of a document: method, URL, headers and body as written."""

    method: str
    url: str
    headers: dict[str, str]
    body: str | None
    response: Any = None  # the documented response right after it, if any


@dataclass
class Response:
    """A documented response without a curl of its own, and the prose before it."""

    body: Any
    note: str = ""


@dataclass
class Doc:
    """What one document shows, in order."""

    name: str
    items: list[Curl | Response] = field(default_factory=list)


def _curl(command: str) -> Curl:
    """Parse one curl command (its lines joined); any option but -X, -H, -d fails."""
    tokens = shlex.split(command.replace("\\\n", " "))
    assert tokens[0] == "curl", tokens
    method, url, headers, body = "GET", "", {}, None
    i = 1
    while i < len(tokens):
        tok = tokens[i]
        if tok == "-X":
            method, i = tokens[i + 1], i + 2
        elif tok == "-H":
            name, _, value = tokens[i + 1].partition(":")
            headers[name.strip().lower()] = value.strip()
            i += 2
        elif tok == "-d":
            body, i = tokens[i + 1], i + 2
            method = "POST" if method == "GET" else method
        elif tok.startswith("-"):
            raise AssertionError(f"curl option {tok} is not understood by this test")
        else:
            url, i = tok, i + 1
    return Curl(method, url, headers, body)


def _json_of_comment(lines: list[str]) -> tuple[str, Any] | None:
    """The prose and the JSON of a run of ``#`` comment lines (``None``: no JSON)."""
    text = [re.sub(r"^#\s?(→\s*)?", "", line.strip()) for line in lines]
    for start, line in enumerate(text):
        if line.lstrip().startswith("{"):
            return " ".join(text[:start]), json.loads("\n".join(text[start:]))
    return None


def _block_items(body: str) -> list[Curl | Response]:
    """The curls and commented responses of one code block (or plain-text document)."""
    lines = body.splitlines()
    out: list[Curl | Response] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("curl "):
            j = i + 1
            while lines[j - 1].rstrip().endswith("\\") or not _splits("\n".join(lines[i:j])):
                j += 1
            out.append(_curl("\n".join(lines[i:j])))
            i = j
        elif line.lstrip().startswith("#"):
            j = i
            while j < len(lines) and lines[j].lstrip().startswith("#"):
                j += 1
            found = _json_of_comment(lines[i:j])
            if found is not None:
                note, value = found
                if out and isinstance(out[-1], Curl) and out[-1].response is None and not note:
                    out[-1].response = value  # "# → {...}" right under its curl
                else:
                    out.append(Response(value, note))
            i = j
        else:
            i += 1
    return out


def _splits(command: str) -> bool:
    try:
        shlex.split(command.replace("\\\n", " "))
    except ValueError:
        return False
    return True


def parse(path: Path) -> Doc:
    """Every exchange a document shows: fenced blocks of a markdown file in order (a
    ```` ```json ```` block right after a curl is that curl's response), or the whole
    text of a plain one."""
    text = path.read_text()
    doc = Doc(path.name)
    fences = re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)
    blocks = fences if fences else [("", text)]
    for lang, body in blocks:
        if lang == "json":
            value = json.loads(body)
            last = doc.items[-1] if doc.items else None
            if isinstance(last, Curl) and last.response is None and "data" in value:
                last.response = value
            else:
                doc.items.append(Response(value))
        else:
            doc.items.extend(_block_items(body))
    return doc


# ---------------------------------------------------------------------- comparing


def assert_shape(ours: Any, documented: Any, where: str = "") -> None:
    """``ours`` has the documented shape: see the module docstring."""
    if isinstance(documented, dict):
        assert isinstance(ours, dict), (where, ours)
        for key, value in documented.items():
            assert key in ours, (f"{where}.{key} missing", ours)
            assert_shape(ours[key], value, f"{where}.{key}")
    elif isinstance(documented, list):
        assert isinstance(ours, list), (where, ours)
        assert len(ours) == len(documented), (where, ours)
        for i, (mine, theirs) in enumerate(zip(ours, documented, strict=True)):
            assert_shape(mine, theirs, f"{where}[{i}]")
    elif isinstance(documented, str) and ID.fullmatch(documented):
        assert isinstance(ours, str), (where, ours)
        assert re.fullmatch(ID.fullmatch(documented)[1] + r"_[0-9a-f]{32}", ours), (where, ours)
    elif isinstance(documented, str) and re.search(TIME, documented):
        pattern = "".join(
            TIME if re.fullmatch(TIME, part) else re.escape(part)
            for part in re.split(f"({TIME})", documented)
        )
        assert isinstance(ours, str), (where, ours)
        assert re.fullmatch(pattern, ours), (where, ours, documented)
    else:
        assert ours == documented, (where, ours, documented)


# ---------------------------------------------------------------------- the server


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    """``baton serve`` on a free loopback port over ``ledger_url``."""

    base: str
    ledger_url: str

    def key(self, org: str, principal: str, role: str = "agent") -> str:
        """A new bearer key of ``principal`` in ``org`` (the secret)."""
        secret, _ = create_key(self.ledger_url, org=org, principal=principal, role=role)
        return secret


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``baton serve`` started as a subprocess (stopped by its pid after the module)."""
    tmp = tmp_path_factory.mktemp("seed")
    ledger_url = f"sqlite:///{tmp / 'ledger.db'}"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    log = (tmp / "serve.log").open("wb")
    args = [BATON, "--ledger-url", ledger_url, "serve", "--host", "127.0.0.1", "--port"]
    proc = subprocess.Popen([*args, str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp / "serve.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "baton serve did not listen"
                time.sleep(0.05)
        yield Served(f"http://127.0.0.1:{port}", ledger_url)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        log.close()


def send(served: Served, curl: Curl, key: str, replace: dict[str, str]) -> httpx.Response:
    """Send ``curl`` as written to the served API with ``key`` as ``$TITEN_API_KEY``
    (and the ids of ``replace`` swapped for this server's)."""
    assert curl.url.startswith(SEED_BASE), curl.url
    headers = {k: v.replace("$TITEN_API_KEY", key) for k, v in curl.headers.items()}
    body = curl.body
    for old, new in replace.items():
        body = body.replace(old, new) if body is not None else None
    url = served.base + curl.url[len(SEED_BASE) :]
    return httpx.request(curl.method, url, headers=headers, content=body, timeout=60)


def _items(name: str) -> list[Curl | Response]:
    return parse(DOCS / name).items


def test_the_documents_hold_the_exchanges() -> None:
    """The parser finds what the documents show: 000 has two curls (acquire with its
    answer, handoff with its answer) and three more responses (the conflict, the inbox,
    the resolve refusal); 003 has the acquire curl and the conflict."""
    doc0 = _items("000_leases_handoffs.md")
    assert [type(x).__name__ for x in doc0] == ["Curl", "Response", "Curl", "Response", "Response"]
    assert all(x.response is not None for x in doc0 if isinstance(x, Curl))
    doc3 = _items("003_two_agents.txt")
    assert [type(x).__name__ for x in doc3] == ["Curl", "Response"]
    assert "second agent" in doc3[1].note  # type: ignore[union-attr]


def _ok(resp: httpx.Response) -> Any:
    assert 200 <= resp.status_code < 300, resp.text
    return resp.json()


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_leases_and_handoffs_document(served: Served) -> None:
    """Document 000 in order: acquire (its answer), a second principal's 409 CONFLICT
    with the expiry only, the handoff (its answer), the recipient's inbox, and the
    sender's resolve refused with the seed's VALIDATION_ERROR; then what its prose says:
    a second resolve is 404, a re-acquire gives a new lease_id whose predecessor is 404
    on release, and DELETE answers lease_id and released_at."""
    org = "org-" + uuid.uuid4().hex[:8]
    sender = served.key(org, SENDER)
    other = served.key(org, "agent_other")
    reviewer = served.key(org, "agent_reviewer")
    acquire, conflict, handoff, inbox, refusal = _items("000_leases_handoffs.md")
    assert isinstance(acquire, Curl)
    assert isinstance(handoff, Curl)
    assert isinstance(conflict, Response)
    assert isinstance(inbox, Response)
    assert isinstance(refusal, Response)

    first = send(served, acquire, sender, {})
    assert_shape(_ok(first), acquire.response)
    lease_id = first.json()["data"]["lease_id"]

    taken = send(served, acquire, other, {})
    assert taken.status_code == 409  # "The second principal gets `409`"
    assert_shape(taken.json(), conflict.body)
    assert taken.json()["error"]["message"].endswith(first.json()["data"]["expires_at"] + ".")

    # the handoff names a checkpoint: save one and send its id in place of the example's
    documented_id = json.loads(handoff.body or "{}")["checkpoint_id"]
    ck = {"subject_id": "user_rama", "kind": "task_state", "state": {"step": 1}}
    saved = _ok(httpx.post(f"{served.base}/v1/checkpoints", json=ck, headers=_auth(sender)))
    created = send(served, handoff, sender, {documented_id: saved["data"]["checkpoint_id"]})
    assert_shape(_ok(created), handoff.response)
    hid = created.json()["data"]["handoff_id"]

    listed = httpx.get(f"{served.base}/v1/handoffs", headers=_auth(reviewer))
    assert_shape(_ok(listed), inbox.body)
    empty = _ok(httpx.get(f"{served.base}/v1/handoffs", headers=_auth(sender)))
    assert empty["data"]["handoffs"] == []  # "The sender's own list comes back empty"

    resolve = f"{served.base}/v1/handoffs/{hid}/resolve"
    refused = httpx.post(resolve, json={"status": "accepted"}, headers=_auth(sender))
    assert refused.status_code == 400
    assert_shape(refused.json(), refusal.body)

    _ok(httpx.post(resolve, json={"status": "accepted"}, headers=_auth(reviewer)))
    again = httpx.post(resolve, json={"status": "rejected"}, headers=_auth(reviewer))
    assert again.status_code == 404

    renewed = _ok(send(served, acquire, sender, {}))["data"]["lease_id"]
    assert renewed != lease_id  # "you get a new lease_id"
    gone = httpx.delete(f"{served.base}/v1/leases/{lease_id}", headers=_auth(sender))
    assert gone.status_code == 404
    released = _ok(httpx.delete(f"{served.base}/v1/leases/{renewed}", headers=_auth(sender)))
    assert_shape(released["data"], {"lease_id": renewed, "released_at": "2026-07-30T10:58:13.829Z"})
    twice = httpx.delete(f"{served.base}/v1/leases/{renewed}", headers=_auth(sender))
    assert twice.status_code == 404


def test_two_agents_document(served: Served) -> None:
    """Document 003: the acquire curl succeeds; the second agent sending it gets the 409
    CONFLICT with the expiry and nothing else."""
    org = "org-" + uuid.uuid4().hex[:8]
    acquire, conflict = _items("003_two_agents.txt")
    assert isinstance(acquire, Curl)
    assert isinstance(conflict, Response)
    first = send(served, acquire, served.key(org, "agent-a"), {})
    assert_shape(_ok(first), {"data": {"lease_id": "lease_" + "0" * 32}})
    second = send(served, acquire, served.key(org, "agent-b"), {})
    assert second.status_code == 409
    assert_shape(second.json(), conflict.body)
    body = second.json()["error"]
    assert "agent-a" not in json.dumps(body)
    assert "rollback" not in json.dumps(body)
