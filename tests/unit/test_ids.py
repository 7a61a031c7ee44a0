"""Random ids from the per-process pool (prefect_baton._ids): the format of uuid4 and
``os.urandom(n).hex()``, no id handed out twice, and a forked child with a pool of its own."""

from __future__ import annotations

import os
import re
import uuid

import pytest

from prefect_baton import _ids


def test_uuid4_hex_is_a_version_4_uuid_in_hex() -> None:
    value = _ids.random_uuid4_hex()
    assert re.fullmatch(r"[0-9a-f]{32}", value)
    parsed = uuid.UUID(hex=value)
    assert parsed.version == 4
    assert parsed.variant == uuid.RFC_4122


@pytest.mark.parametrize("n", [0, 1, 13, 16, 4096, 5000])
def test_random_hex_has_two_digits_per_byte(n: int) -> None:
    assert re.fullmatch(rf"[0-9a-f]{{{2 * n}}}", _ids.random_hex(n))
    assert len(_ids.random_bytes(n)) == n


def test_no_id_is_handed_out_twice_across_refills() -> None:
    ids = [_ids.random_uuid4_hex() for _ in range(2000)]  # about 8 refills of the pool
    assert len(set(ids)) == len(ids)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_draws_ids_of_its_own() -> None:
    _ids.random_hex(1)  # the parent's pool holds unused bytes now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.write(write, _ids.random_hex(16).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = _ids.random_hex(16)
    assert len(child) == 32
    assert child != parent  # the child did not reuse the parent's next bytes
