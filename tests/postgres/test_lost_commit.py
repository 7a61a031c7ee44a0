"""PostgreSQL: the reply to the ``COMMIT`` of an idempotency claim is lost (issue #13, 5).

A loopback TCP proxy between the ledger store and the server forwards everything, except
that once armed it swallows the server's reply to the ``COMMIT`` of the first transaction
that inserted into ``baton_receipts`` and then drops the client's connection: the claim is
committed on the server, the caller gets ``UNAVAILABLE`` and never ran the operation. The
keyed retry must learn the claim's real outcome (its own, abandoned) and run the operation,
instead of ``IDEMPOTENCY_IN_FLIGHT`` until the claim lapses.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy import select
from sqlmodel import col

from prefect_baton import Baton, UnavailableError
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.ledger.tables import ReceiptRow
from tests.conftest import store_for


class LostCommitReply:
    """A TCP proxy on a free 127.0.0.1 port in front of ``upstream`` (see the module
    docstring); :meth:`arm` makes it lose the next claim's ``COMMIT`` reply."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = int(self.listener.getsockname()[1])
        self.armed = threading.Event()
        self.lost = threading.Event()  # set once a COMMIT reply was swallowed
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self.armed.set()

    def close(self) -> None:
        self._closing = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            state = {"insert": False, "swallow": False}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, state: dict[str, bool]) -> None:
        """Client to server; after forwarding the armed COMMIT, wait for the server to
        answer (the reply is swallowed by :meth:`_down`), then drop the client."""
        try:
            while data := client.recv(65536):
                if self.armed.is_set() and b"INSERT INTO baton_receipts" in data:
                    state["insert"] = True
                if state["insert"] and b"COMMIT" in data:
                    self.armed.clear()
                    state["swallow"] = True
                    server.sendall(data)
                    self.lost.wait(10)
                    break
                server.sendall(data)
        except OSError:
            pass
        for s in (client, server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _down(self, server: socket.socket, client: socket.socket, state: dict[str, bool]) -> None:
        try:
            while data := server.recv(65536):
                if state["swallow"]:
                    self.lost.set()  # the COMMIT's reply: never delivered
                    continue
                client.sendall(data)
        except OSError:
            pass


@pytest.fixture
def proxied(pg_url: str) -> Iterator[tuple[LostCommitReply, str]]:
    """The proxy in front of the test server, and the ledger URL through it."""
    parts = urlsplit(pg_url)
    proxy = LostCommitReply((parts.hostname or "127.0.0.1", parts.port or 5432))
    netloc = f"{parts.username}@127.0.0.1:{proxy.port}" if parts.username else None
    url = urlunsplit(parts._replace(netloc=netloc or f"127.0.0.1:{proxy.port}"))
    yield proxy, url
    proxy.close()


def test_retry_learns_its_claim_after_the_commit_reply_was_lost(
    pg_url: str, proxied: tuple[LostCommitReply, str]
) -> None:
    """A keyed release whose claim's COMMIT reply was lost raises UNAVAILABLE; its retry
    runs the release (status ``released``), not IDEMPOTENCY_IN_FLIGHT until the claim
    lapses, and the lease is free."""
    proxy, url = proxied
    store_for(pg_url)  # the schema, migrated directly
    org = f"org-{uuid.uuid4().hex[:12]}"
    store = LedgerStore(url, migrate=False)
    b = Baton(org=org, principal="agent-a", store=store)
    lease = b.leases.acquire("deploy", "svc", ttl_seconds=60)
    proxy.arm()
    with pytest.raises(UnavailableError):
        b.leases.release(lease, idempotency_key="rel-1")
    assert proxy.lost.is_set(), "the proxy did not see the claim's COMMIT"
    with store_for(pg_url)._read() as (s, _now):
        claim = s.execute(
            select(ReceiptRow).where(
                col(ReceiptRow.org_id) == org, col(ReceiptRow.idem_key) == "rel-1"
            )
        ).scalar_one()
        assert not claim.response.startswith("{")  # a claim: committed, nothing ran
    assert b.leases.inspect("deploy", "svc").held
    receipt = b.leases.release(lease, idempotency_key="rel-1")
    assert (receipt.status, receipt.replayed) == ("released", False)
    assert not b.leases.inspect("deploy", "svc").held
    assert b.leases.release(lease, idempotency_key="rel-1").replayed
    store.close()
