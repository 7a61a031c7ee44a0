-- rotate.lua: move an org to the next incarnation's epoch range once the current range is
-- used up (the new number was recorded in the ledger first).
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- ARGV[1] the marker id the caller saw, ARGV[2] new incarnation number, ARGV[3] new floor,
-- ARGV[4] new ceiling. The marker id (which names the journal's incarnation) is kept.
-- Returns:
--   {0}                                  rotated
--   {32}                                 the marker changed meanwhile (nothing done)
local m = redis.call('HGET', KEYS[1], 'id')
if m ~= ARGV[1] then return {C_REBUILD_LOST} end
redis.call('HSET', KEYS[1], 'n', ARGV[2], 'floor', ARGV[3], 'ceil', ARGV[4])
return {C_OK}
