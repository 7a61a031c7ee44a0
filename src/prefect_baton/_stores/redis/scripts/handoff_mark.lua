-- handoff_mark.lua: settle a lease-carrying handoff as rejected before the ledger records
-- it, so that a concurrent accept cannot transfer the lease afterwards.
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- ARGV[1] handoff id, ARGV[2] how long the resolution is kept (ms), ARGV[3] the handoff's
-- expiry (epoch ms, or '' for none), ARGV[4] this rejection's token, ARGV[5] the field of
-- rc holding the handoff's resolution.
-- Returns:
--   {0, 1}                               marked rejected by this call (it decides the end)
--   {0, 0}                               already marked rejected by another rejection
--   {12, message}                        NOT_FOUND: the handoff was accepted, or its
--                                        deadline has passed on the Redis clock (as
--                                        transfer.lua refuses an accept past it)
--   {30}                                 no incarnation marker
if not marker() then return {C_NO_INCARNATION} end
local now = now_ms()
local res = kept(ARGV[5], now)
if res and (res == 'r' or string.sub(res, 1, 2) == 'r:') then return {C_OK, 0} end
if res then return {C_NOT_FOUND, 'pending handoff ' .. ARGV[1] .. ' not found'} end
local hexp = opt(ARGV[3])
if hexp and tonumber(hexp) <= now then
  return {C_NOT_FOUND, 'handoff ' .. ARGV[1] .. ' has expired'}
end
keep(ARGV[5], 'r:' .. ARGV[4], tonumber(ARGV[2]), now)
return {C_OK, 1}
