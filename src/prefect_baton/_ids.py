"""Random ids from a per-process pool of ``os.urandom`` bytes.

``uuid.uuid4()`` and ``os.urandom(n)`` make one ``getrandom`` system call each, and every call
releases the GIL: in a busy process (a Prefect run, with its events and API threads) the
caller then waits for another thread to give the GIL back, about a millisecond per id on a
loaded machine. A lease takes several ids (idempotency key, attempt, lease id, receipt claim
token). These functions draw the same operating-system randomness 4,096 bytes at a time and
hand out slices, so an id costs one system call per 256 ids of 16 bytes. Bytes are never
handed out twice; a ``fork()``-ed child starts with an empty pool of its own.
"""

from __future__ import annotations

import os
import threading
import uuid

__all__ = ["random_bytes", "random_hex", "random_uuid4_hex"]

_CHUNK = 4096


class _Pool:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buf = b""
        self.pos = 0

    def take(self, n: int) -> bytes:
        with self.lock:
            end = self.pos + n
            if end > len(self.buf):
                self.buf = os.urandom(max(_CHUNK, n))
                self.pos, end = 0, n
            out = self.buf[self.pos : end]
            self.pos = end
            return out


_pool = _Pool()


def _reset_in_child() -> None:
    global _pool
    _pool = _Pool()


os.register_at_fork(after_in_child=_reset_in_child)


def random_bytes(n: int) -> bytes:
    """``n`` bytes of ``os.urandom`` randomness (``n`` >= 0), from the process's pool."""
    return _pool.take(n)


def random_hex(n: int = 16) -> str:
    """``2 * n`` lowercase hex digits of ``os.urandom`` randomness (as ``os.urandom(n).hex()``)."""
    return _pool.take(n).hex()


def random_uuid4_hex() -> str:
    """A random version-4 UUID as 32 lowercase hex digits (as ``uuid.uuid4().hex``)."""
    return uuid.UUID(bytes=_pool.take(16), version=4).hex
