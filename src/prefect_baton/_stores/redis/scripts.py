"""The Lua scripts (one per operation in ``scripts/*.lua``), their return codes, and the one
table that maps a code to the :mod:`prefect_baton.errors` exception it raises.

Each script is ``scripts/_lib.lua`` followed by the operation's file, registered once per
client with ``register_script`` (EVALSHA, reloaded on NOSCRIPT by redis-py).

The same files also make one Redis function library (Redis 7 ``FUNCTION LOAD``, see
:func:`library`): ``_lib.lua`` and ``_acquire.lua`` once, each operation a function. A call
through the library (``FCALL``) does not run the helpers' definitions again, as every
``EVALSHA`` does; :func:`prefect_baton._stores.redis.connection.evalsha` prefers it where the server
has functions, and falls back to the scripts where it does not. The library's name carries a
digest of its text, so clients of different versions use their own library side by side.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any

from redis.commands.core import Script

from prefect_baton._rules import core as _core
from prefect_baton._rules import scopes as _scopes
from prefect_baton._rules import transitions as _transitions
from prefect_baton._rules.digests import mismatch
from prefect_baton._stores.redis.cluster import RedisClient
from prefect_baton.errors import (
    BatonError,
    ForbiddenError,
    LeaseLostError,
    NotFoundError,
    ValidationError,
    VersionConflictError,
)

__all__ = ["CODES", "OPERATIONS", "Library", "Scripts", "library", "raise_for"]

OK, NOOP, REPLAY = 0, 1, 2
CONFLICT, VERSION, NOT_FOUND, LOST = 10, 11, 12, 13
MISMATCH, INVALID, FORBIDDEN, IN_FLIGHT, UNKNOWN = 14, 15, 16, 17, 20
WRONG_KEY = 18
SCOPE_STEPS = 19  # the write-scope comparison ran out of steps (ScopeCheckBudget)
NO_INCARNATION, ROTATE, REBUILD_LOST = 30, 31, 32

OPERATIONS = (
    "acquire",
    "acquire_many",
    "acquire_plain",
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
    return mismatch("acquire", _text(args[0]))


#: Return code -> builder of the error it means (arguments: the reply after the code).
CODES: dict[int, Callable[[Sequence[Any]], BatonError]] = {
    CONFLICT: _conflict,
    VERSION: _version,
    NOT_FOUND: lambda a: NotFoundError(_text(a[0])),
    LOST: lambda a: LeaseLostError(_text(a[0]), status=_text(a[1]) if len(a) > 1 else None),
    MISMATCH: _mismatch,
    INVALID: lambda a: ValidationError(_text(a[0])),
    FORBIDDEN: lambda a: ForbiddenError(_text(a[0])),
    IN_FLIGHT: lambda a: _core.in_flight(_text(a[0]), int(a[1])),
    SCOPE_STEPS: lambda _a: _scopes.too_costly(),
    WRONG_KEY: lambda a: _transitions.wrong_execution_key(
        _text(a[0]), held_key=int(a[1]) == 1, given_key=int(a[2]) == 1
    ),
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
def _file(name: str) -> str:
    return resources.files(__package__).joinpath("scripts", name).read_text(encoding="utf-8")


def _uses(own: str) -> list[str]:
    """The helper files an operation's first line names (``-- uses: _acquire.lua``)."""
    first = own.split("\n", 1)[0]
    if not first.startswith("-- uses:"):
        return []
    return [extra.strip() for extra in first.removeprefix("-- uses:").split(",")]


@cache
def source(name: str) -> str:
    """The full text registered for operation ``name``: ``_lib.lua``, the files its first
    line names (``-- uses: _acquire.lua``), then ``<name>.lua``."""
    own = _file(f"{name}.lua")
    return "\n".join([_file("_lib.lua"), *map(_file, _uses(own)), own])


class Library:
    """The function library made of the scripts (see the module docstring).

    Attributes:
        name: the library's name, ``baton_<12 hex digits of the text's SHA-1>`` (``str``).
        text: the ``FUNCTION LOAD`` payload (``str``).
        functions: operation name -> its function's name (``baton_<digest>_<operation>``).
    """

    def __init__(self) -> None:
        helpers: list[str] = []
        bodies: list[str] = []
        for op in OPERATIONS:
            own = _file(f"{op}.lua")
            helpers += [h for h in _uses(own) if h not in helpers]
            # Each operation's file becomes a function body: its top-level locals and
            # returns are the function's. KEYS, ARGV and the per-call caches are set first.
            bodies.append(f"local function op_{op}()\n{own}\nend\n")
        core = "\n".join(["local KEYS, ARGV", _file("_lib.lua"), *map(_file, helpers), *bodies])
        digest = hashlib.sha1(core.encode("utf-8")).hexdigest()[:12]
        self.name = f"baton_{digest}"
        self.functions = {op: f"{self.name}_{op}" for op in OPERATIONS}
        registrations = [
            f"redis.register_function('{self.functions[op]}', function(keys, args)\n"
            f"  KEYS, ARGV, _ints, _scope_steps = keys, args, {{}}, SCOPE_CHECK_STEPS\n"
            f"  return op_{op}()\nend)"
            for op in OPERATIONS
        ]
        self.text = "\n".join([f"#!lua name={self.name}", core, *registrations, ""])


@cache
def library() -> Library:
    """The function library of this version of the scripts (built once per process)."""
    return Library()


class Scripts:
    """The registered scripts of one Redis client, one attribute per operation.

    Args:
        client: a ``redis.Redis`` or ``redis.cluster.RedisCluster`` client
            (``decode_responses`` either way).
        functions: call operations through the function :func:`library` where the server
            has functions (default ``True``); ``False`` always runs the scripts.

    Attributes:
        functions: ``None`` until the first call tells, then whether the server runs the
            library (``False`` after ``FCALL`` or ``FUNCTION LOAD`` was refused: Redis before
            7.0, or an ACL without them).
    """

    def __init__(self, client: RedisClient, *, functions: bool = True) -> None:
        self._by_name: dict[str, Script] = {
            name: client.register_script(source(name)) for name in OPERATIONS
        }
        self.functions: bool | None = None if functions else False

    def __getitem__(self, name: str) -> Script:
        return self._by_name[name]
