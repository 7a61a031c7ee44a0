"""The Lua scripts (one per operation in ``scripts/*.lua``), their return codes, and the one
table that maps a code to the :mod:`prefect_baton.errors` exception it raises.

Each script is ``scripts/_lib.lua`` followed by the operation's file, registered once per
client with ``register_script`` (EVALSHA, reloaded on NOSCRIPT by redis-py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any

from redis.commands.core import Script

from .. import _core
from ..errors import (
    BatonError,
    ForbiddenError,
    IdempotencyMismatchError,
    LeaseLostError,
    NotFoundError,
    ValidationError,
    VersionConflictError,
)
from .cluster import RedisClient

__all__ = ["CODES", "OPERATIONS", "Scripts", "raise_for"]

OK, NOOP, REPLAY = 0, 1, 2
CONFLICT, VERSION, NOT_FOUND, LOST = 10, 11, 12, 13
MISMATCH, INVALID, FORBIDDEN, UNKNOWN = 14, 15, 16, 20
NO_INCARNATION, ROTATE, REBUILD_LOST = 30, 31, 32

OPERATIONS = (
    "acquire",
    "acquire_many",
    "renew",
    "transfer",
    "release",
    "release_by_id",
    "force_release",
    "inspect",
    "get",
    "list",
    "handoff_mark",
    "restore",
    "clear",
    "install",
    "rotate",
    "unlock",
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _conflict(args: Sequence[Any]) -> BatonError:
    kind = int(args[1])  # 0: another principal, 1: a write scope, 2: another execution
    return _core.conflict(
        int(args[0]),
        "A write scope" if kind == 1 else "Resource",
        by="execution" if kind == 2 else "principal",
    )


def _version(args: Sequence[Any]) -> BatonError:
    cur, exp = int(args[0]), int(_text(args[1]).lstrip("="))
    return VersionConflictError(
        f"expected version {exp}, current version is {cur}",
        current_version=cur,
        expected_version=exp,
    )


def _mismatch(args: Sequence[Any]) -> BatonError:
    return IdempotencyMismatchError(
        f"idempotency key {_text(args[0])!r} was used for a different acquire request"
    )


#: Return code -> builder of the error it means (arguments: the reply after the code).
CODES: dict[int, Callable[[Sequence[Any]], BatonError]] = {
    CONFLICT: _conflict,
    VERSION: _version,
    NOT_FOUND: lambda a: NotFoundError(_text(a[0])),
    LOST: lambda a: LeaseLostError(_text(a[0])),
    MISMATCH: _mismatch,
    INVALID: lambda a: ValidationError(_text(a[0])),
    FORBIDDEN: lambda a: ForbiddenError(_text(a[0])),
}


def raise_for(reply: Sequence[Any]) -> None:
    """Raise the error a script's refusal ``reply`` (``[code, *args]``) means; return for
    the success codes. Codes the caller must handle itself (20, 30..32) are not in
    :data:`CODES` and raise a plain :class:`BatonError` here."""
    code = int(reply[0])
    if code in (OK, NOOP, REPLAY):
        return
    build = CODES.get(code)
    if build is None:
        raise BatonError(f"unexpected reply from the Redis lease authority: {list(reply)!r}")
    raise build(reply[1:])


@cache
def source(name: str) -> str:
    """The full text registered for operation ``name``: ``_lib.lua``, the files its first
    line names (``-- uses: _acquire.lua``), then ``<name>.lua``."""
    folder = resources.files(__package__).joinpath("scripts")
    own = folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    parts = [folder.joinpath("_lib.lua").read_text(encoding="utf-8")]
    first = own.split("\n", 1)[0]
    if first.startswith("-- uses:"):
        for extra in first.removeprefix("-- uses:").split(","):
            parts.append(folder.joinpath(extra.strip()).read_text(encoding="utf-8"))
    return "\n".join([*parts, own])


class Scripts:
    """The registered scripts of one Redis client, one attribute per operation.

    Args:
        client: a ``redis.Redis`` or ``redis.cluster.RedisCluster`` client
            (``decode_responses`` either way).
    """

    def __init__(self, client: RedisClient) -> None:
        self._by_name: dict[str, Script] = {
            name: client.register_script(source(name)) for name in OPERATIONS
        }

    def __getitem__(self, name: str) -> Script:
        return self._by_name[name]
