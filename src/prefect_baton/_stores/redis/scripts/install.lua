-- install.lua: set the incarnation marker once the rebuild is complete, and drop the lock.
-- From then on operations run again, with epochs above the new floor. Every per-org key
-- gets its pad entry here (see marker() in _lib.lua).
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- KEYS[13]: the rebuild lock.
-- ARGV[1] rebuild token, ARGV[2] incarnation id, ARGV[3] incarnation number n,
-- ARGV[4] epoch floor, ARGV[5] epoch ceiling, ARGV[6] no new grant before this ms
-- (lock_delay policy; 0 otherwise), ARGV[7] retention of superseded generations in ms.
-- Returns:
--   {0}                                  installed
--   {32}                                 the rebuild lock was lost, a marker exists, or a
--                                        key padded by clear.lua is gone (evicted while
--                                        the ledger's leases were loaded): the lock is
--                                        dropped and the next operation rebuilds again
if redis.call('GET', KEYS[13]) ~= ARGV[1] then return {C_REBUILD_LOST} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {C_REBUILD_LOST} end
if redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8],
    KEYS[9], KEYS[11], KEYS[12]) ~= 10 then
  redis.call('DEL', KEYS[13])
  return {C_REBUILD_LOST}
end
redis.call('HSET', KEYS[1], 'id', ARGV[2], 'n', ARGV[3], 'floor', ARGV[4], 'ceil', ARGV[5],
  'delay', ARGV[6], 'ret', ARGV[7], PAD_FIELD, PAD)
-- Every per-org key keeps its pad entry, so that all of them exist from now on (marker()).
pad_keys()
redis.call('DEL', KEYS[13])
return {C_OK}
