"""Bearer keys of the REST API.

A key is ``bk_<random>`` (43 URL-safe characters of :func:`secrets.token_urlsafe`). It is
shown once, by :func:`create_key`; the ledger keeps only its SHA-256 (table
``baton_api_keys``), mapped to an org, a principal, a role and scopes. :func:`authenticate`
looks a presented secret up by that hash; a revoked key no longer authenticates. No
function here logs a secret or a hash.

The REST server keeps the valid keys it has looked up in a :class:`KeyCache` for
``BATON_KEY_CACHE_SECONDS`` (default 2 s; ``0`` disables it). :func:`revoke_key` empties
every cache of its own process once the revocation is committed, so there a revoked key is
refused at once; a revocation made by another process (``baton keys revoke``) is seen when
the cached entry ages out, at most ``BATON_KEY_CACHE_SECONDS`` later. Unknown and revoked
keys are never cached.

Scopes are ``<area>:read`` / ``<area>:write`` for the areas ``leases``, ``handoffs``,
``checkpoints``, ``outcomes`` and ``events``; a REST route needs the scope of its area
(``GET`` reads, anything else writes).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict
from sqlalchemy import update
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, col, select

from prefect_baton._rules import core as _core
from prefect_baton._rules.paging import decode_cursor, fetch_page
from prefect_baton._settings import load_settings
from prefect_baton._stores.ledger.engine import Engines, ledger_failure, make_engines, upgrade
from prefect_baton._stores.ledger.paging import after_key
from prefect_baton._stores.ledger.tables import ApiKeyRow
from prefect_baton.errors import NotFoundError, ValidationError
from prefect_baton.models import Page

__all__ = [
    "ALL_SCOPES",
    "AREAS",
    "KEY_PREFIX",
    "ApiKey",
    "KeyCache",
    "authenticate",
    "create_key",
    "hash_key",
    "list_keys",
    "revoke_key",
]

KEY_PREFIX = "bk_"
AREAS = ("leases", "handoffs", "checkpoints", "outcomes", "events")
ALL_SCOPES: tuple[str, ...] = tuple(f"{a}:{m}" for a in AREAS for m in ("read", "write"))

# Bumped (under the lock) after every committed revocation in this process; a cache entry
# made from a lookup that started under an older value is no longer used.
_revocations = 0
_revocations_lock = threading.Lock()


def _revoked_here() -> None:
    global _revocations
    with _revocations_lock:
        _revocations += 1


class ApiKey(BaseModel):
    """A stored key, without its secret.

    Attributes:
        key_id: public id of the key (``key_<hex>``), used to revoke it.
        org, principal, role: the identity the key authenticates as.
        scopes: the scopes it grants (subset of :data:`ALL_SCOPES`).
        created_at_ms, revoked_at_ms: epoch milliseconds; ``revoked_at_ms`` is ``None``
            while the key is valid.
    """

    model_config = ConfigDict(frozen=True)

    key_id: str
    org: str
    principal: str
    role: str
    scopes: tuple[str, ...]
    created_at_ms: int
    revoked_at_ms: int | None = None

    @property
    def revoked(self) -> bool:
        """Whether the key has been revoked."""
        return self.revoked_at_ms is not None


def hash_key(secret: str) -> str:
    """The stored form of a key: the SHA-256 hex digest of ``secret`` (``str``)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@contextmanager
def _ledger(ledger_url: str | None, engines: Engines | None) -> Iterator[Engines]:
    """The ledger a key function works on: ``engines`` when given (left open), else the
    ledger of ``ledger_url`` (default ``BATON_LEDGER_URL``), migrated if needed and
    disposed of on exit. A statement the database fails with inside raises the store's
    error of it (:func:`~prefect_baton._stores.ledger.engine.ledger_failure`:
    ``UNAVAILABLE`` naming the cause, e.g. a read-only SQLite file)."""
    own = None
    if engines is None:
        own = engines = make_engines(ledger_url or load_settings().ledger_url)
    try:
        if own is not None:
            upgrade(own)
        yield engines
    except OperationalError as exc:
        raise ledger_failure(engines, exc) from exc
    finally:
        if own is not None:
            own.dispose()


def _to_model(row: ApiKeyRow) -> ApiKey:
    return ApiKey(
        key_id=row.key_id,
        org=row.org_id,
        principal=row.principal,
        role=row.role,
        scopes=tuple(json.loads(row.scopes)),
        created_at_ms=row.created_at_ms,
        revoked_at_ms=row.revoked_at_ms,
    )


def _validate_scopes(scopes: Iterable[str] | None) -> tuple[str, ...]:
    if scopes is None:
        return ALL_SCOPES
    if isinstance(scopes, str):
        raise ValidationError("scopes must be a list of scope names, not one string")
    out: list[str] = []
    for s in scopes:
        if s not in ALL_SCOPES:
            raise ValidationError(f"unknown scope {s!r}; known: {', '.join(ALL_SCOPES)}")
        if s not in out:
            out.append(s)
    return tuple(out)


def create_key(
    ledger_url: str | None = None,
    *,
    org: str,
    principal: str,
    role: str = "agent",
    scopes: Iterable[str] | None = None,
    engines: Engines | None = None,
) -> tuple[str, ApiKey]:
    """Create a bearer key and store only its hash.

    Args:
        ledger_url: the ledger (``str``; default ``BATON_LEDGER_URL``), migrated if needed.
        org, principal: the identity (``str`` ids, 1..256 characters).
        role: ``agent`` (default), ``owner`` or ``admin``.
        scopes: scope names (``Iterable[str]``) from :data:`ALL_SCOPES`; ``None`` grants all.
        engines: an open ledger to use instead of ``ledger_url``.

    Returns:
        ``(secret, key)``: the secret (``bk_...``, shown only now) and the stored
        :class:`ApiKey`.

    Raises:
        ValidationError: a bad id, role or scope. UnavailableError: the ledger is down.
    """
    org_ = _core.validate_id("org", org)
    principal_ = _core.validate_principal("principal", principal)
    role_ = _core.validate_role(role)
    scopes_ = _validate_scopes(scopes)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKeyRow(
        key_id="key_" + uuid.uuid4().hex,
        key_hash=hash_key(secret),
        org_id=org_,
        principal=principal_,
        role=role_,
        scopes=json.dumps(list(scopes_)),
        created_at_ms=int(time.time() * 1000),
    )
    with _ledger(ledger_url, engines) as eng:
        with Session(eng.write, expire_on_commit=False) as session, session.begin():
            session.add(row)
        return secret, _to_model(row)


def list_keys(
    ledger_url: str | None = None,
    *,
    org: str | None = None,
    include_revoked: bool = False,
    limit: int = 1000,
    cursor: str | None = None,
    engines: Engines | None = None,
) -> Page[ApiKey]:
    """One page of the stored keys (never their secrets), oldest first (by creation time
    in ms, then key id).

    Args:
        ledger_url: the ledger (``str``; default ``BATON_LEDGER_URL``).
        org: only this org's keys (``str``). include_revoked: also revoked keys (``bool``).
        limit: at most this many keys (``int``, 1..10,000; default 1,000).
        cursor: continue after the page this cursor ends (``str``: the ``next_cursor`` of
            a previous page, or of ``baton keys list``); give the same ``org`` and
            ``include_revoked`` again.
        engines: an open ledger to use instead of ``ledger_url``.

    Returns:
        One page: a list of keys whose ``next_cursor`` is the ``cursor`` of the next page
        (``str``), or ``None`` when no key follows.

    Raises:
        ValidationError: a bad org id or limit, or a cursor that is not one of the key
            list. UnavailableError: the ledger is down.
    """
    org_ = _core.validate_optional_id("org", org)

    def fetch(n: int) -> list[ApiKey]:
        after = None if cursor is None else decode_cursor("keys", cursor)
        with _ledger(ledger_url, engines) as eng, Session(eng.read) as session:
            q = select(ApiKeyRow)
            if org_ is not None:
                q = q.where(col(ApiKeyRow.org_id) == org_)
            if not include_revoked:
                q = q.where(col(ApiKeyRow.revoked_at_ms).is_(None))
            at, kid = col(ApiKeyRow.created_at_ms), col(ApiKeyRow.key_id)
            if after is not None:
                q = q.where(after_key(at, kid, after))
            # n: one key more than the page (fetch_page), whether another page follows
            q = q.order_by(at, kid).limit(n)
            return [_to_model(r) for r in session.exec(q).all()]

    return fetch_page("keys", limit, fetch)


def revoke_key(
    ledger_url: str | None = None, *, key_id: str, engines: Engines | None = None
) -> ApiKey:
    """Revoke a key by its ``key_id`` (``str``); revoking twice keeps the first time.

    Once committed, every :class:`KeyCache` of this process stops answering cached keys
    (a server in another process sees it within its ``BATON_KEY_CACHE_SECONDS``).

    Returns the revoked :class:`ApiKey`.

    Raises:
        NotFoundError: no key has that id. ValidationError: a bad id.
        UnavailableError: the ledger is down.
    """
    kid = _core.validate_id("key_id", key_id)
    with _ledger(ledger_url, engines) as eng:
        with Session(eng.write, expire_on_commit=False) as session, session.begin():
            session.execute(
                update(ApiKeyRow)
                .where(col(ApiKeyRow.key_id) == kid, col(ApiKeyRow.revoked_at_ms).is_(None))
                .values(revoked_at_ms=int(time.time() * 1000))
            )
            row = session.get(ApiKeyRow, kid)
            if row is None:
                raise NotFoundError(f"no API key {kid}")
            revoked = _to_model(row)
        _revoked_here()
        return revoked


def authenticate(engines: Engines, secret: str) -> ApiKey | None:
    """The valid (unrevoked) key whose hash matches ``secret`` (``str``), else ``None``.

    Raises:
        UnavailableError: the ledger cannot be read (the message names the cause).
    """
    if not secret.startswith(KEY_PREFIX) or len(secret) > 512:
        return None
    digest = hash_key(secret)
    with _ledger(None, engines), Session(engines.read) as session:
        row = session.exec(
            select(ApiKeyRow).where(
                col(ApiKeyRow.key_hash) == digest, col(ApiKeyRow.revoked_at_ms).is_(None)
            )
        ).first()
    return None if row is None else _to_model(row)


class KeyCache:
    """Valid keys recently looked up, by the SHA-256 of their secret, for
    ``ttl_seconds``: what the REST server checks before it asks the ledger.

    Only valid keys are stored (an unknown or revoked secret is looked up every time). An
    entry is used while it is younger than ``ttl_seconds`` and no :func:`revoke_key` of
    this process has committed since its lookup started, so a revocation in this process
    applies at once and one made elsewhere within ``ttl_seconds``. Safe to use from several
    threads; :meth:`get` does no I/O (it may run on the event loop).

    Args:
        ttl_seconds: how long an entry is used (``float`` seconds, ``>= 0``; ``0``
            disables the cache: :meth:`get` always misses).
        max_entries: entries kept at most (``int``, default 10,000); the oldest goes first.
        clock: monotonic clock in seconds (``Callable[[], float]``; default
            :func:`time.monotonic`), replaceable in tests.

    Raises:
        ValidationError: a negative ``ttl_seconds`` or a ``max_entries`` below 1.
    """

    def __init__(
        self,
        ttl_seconds: float,
        *,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not ttl_seconds >= 0:
            raise ValidationError(f"ttl_seconds must be >= 0, got {ttl_seconds!r}")
        if max_entries < 1:
            raise ValidationError(f"max_entries must be >= 1, got {max_entries!r}")
        self.ttl_seconds = float(ttl_seconds)
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        # digest -> (key, monotonic time of the lookup's start, revocation count then)
        self._entries: dict[str, tuple[ApiKey, float, int]] = {}

    def start(self) -> tuple[float, int]:
        """A token to take just before looking a key up in the ledger and to hand to
        :meth:`put` (``(clock reading, revocation count)``)."""
        return self._clock(), _revocations

    def get(self, secret: str) -> ApiKey | None:
        """The cached valid key for ``secret`` (``str``), or ``None`` (not cached, aged
        out, or a revocation in this process since it was looked up)."""
        if self.ttl_seconds <= 0:
            return None
        digest = hash_key(secret)
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            key, started, revocations = entry
            if revocations != _revocations or self._clock() - started >= self.ttl_seconds:
                del self._entries[digest]
                return None
            return key

    def put(self, secret: str, key: ApiKey | None, token: tuple[float, int]) -> None:
        """Remember ``key`` (:class:`ApiKey`; ``None`` is not stored) for ``secret``
        (``str``), looked up after :meth:`start` returned ``token``."""
        if key is None or key.revoked or self.ttl_seconds <= 0:
            return
        started, revocations = token
        digest = hash_key(secret)
        with self._lock:
            if revocations != _revocations:
                return
            self._entries.pop(digest, None)
            while len(self._entries) >= self.max_entries:
                del self._entries[next(iter(self._entries))]
            self._entries[digest] = (key, started, revocations)

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()

    def lookup(self, engines: Engines, secret: str) -> ApiKey | None:
        """:meth:`get`, else :func:`authenticate` on ``engines`` (:class:`Engines`) and
        :meth:`put`: the valid key for ``secret`` (``str``) or ``None``.

        Raises:
            UnavailableError: the ledger is down (on a miss).
        """
        key = self.get(secret)
        if key is not None:
            return key
        token = self.start()
        key = authenticate(engines, secret)
        self.put(secret, key, token)
        return key
