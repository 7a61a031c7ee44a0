"""The Redis fast path for leases: :class:`~.authority.RedisAuthority` (one Lua script per
operation, expiry on Redis ``TIME``), its journal and :mod:`reconciler <.reconciler>` into the
ledger, and the rebuild after Redis data loss (:mod:`.rebuild`).

Use it through ``Baton(..., redis_url="redis://127.0.0.1:6379/0")`` or ``BATON_REDIS_URL``;
without a Redis URL nothing of this package is used. Import from the submodules (this
package exports nothing, so loading one submodule loads no other).
"""
