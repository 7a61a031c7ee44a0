-- handoff_mark.lua: settle a lease-carrying handoff as rejected before the ledger records
-- it, so that a concurrent accept cannot transfer the lease afterwards.
-- KEYS[1..10]: the per-org keys listed in _lib.lua.
-- KEYS[11]: the handoff's resolution key.
-- ARGV[1] handoff id, ARGV[2] resolution key ttl_ms.
-- Returns:
--   {0}                                  marked rejected (or was already)
--   {12, message}                        NOT_FOUND: the handoff was accepted
--   {30}                                 no incarnation marker
if not marker() then return {C_NO_INCARNATION} end
local res = redis.call('GET', KEYS[11])
if res and res ~= 'r' then return {C_NOT_FOUND, 'pending handoff ' .. ARGV[1] .. ' not found'} end
redis.call('SET', KEYS[11], 'r', 'PX', tonumber(ARGV[2]))
return {C_OK}
