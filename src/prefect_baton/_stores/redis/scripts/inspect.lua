-- inspect.lua: the newest generation of one resource and the Redis clock (read only).
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- ARGV[1] resource digest.
-- Returns:
--   {0, now_ms, generation or ""}
--   {30}                                 no incarnation marker
if not marker() then return {C_NO_INCARNATION} end
local head = redis.call('HGET', KEYS[2], ARGV[1])
return {C_OK, I(now_ms()), head or ''}
