-- get.lua: one generation by lease id and the Redis clock (read only); fences use it too.
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- ARGV[1] lease id.
-- Returns:
--   {0, now_ms, generation}
--   {20, now_ms}                         lease id unknown to Redis (pruned, or never seen)
--   {30}                                 no incarnation marker
if not marker() then return {C_NO_INCARNATION} end
local now = now_ms()
local g = gen_by_id(ARGV[1])
if not g then return {C_UNKNOWN, I(now)} end
return {C_OK, I(now), enc(g)}
