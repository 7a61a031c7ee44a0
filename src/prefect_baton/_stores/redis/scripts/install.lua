-- install.lua: set the incarnation marker once the rebuild is complete, and drop the lock.
-- From then on operations run again, with epochs above the new floor. Every per-org key
-- gets its pad entry here (see marker() in _lib.lua).
-- KEYS[1..10]: the per-org keys listed in _lib.lua.
-- KEYS[11]: the rebuild lock.
-- ARGV[1] rebuild token, ARGV[2] incarnation id, ARGV[3] incarnation number n,
-- ARGV[4] epoch floor, ARGV[5] epoch ceiling, ARGV[6] no new grant before this ms
-- (lock_delay policy; 0 otherwise), ARGV[7] retention of superseded generations in ms.
-- Returns:
--   {0}                                  installed
--   {32}                                 the rebuild lock was lost, or a marker exists
if redis.call('GET', KEYS[11]) ~= ARGV[1] then return {C_REBUILD_LOST} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {C_REBUILD_LOST} end
redis.call('HSET', KEYS[1], 'id', ARGV[2], 'n', ARGV[3], 'floor', ARGV[4], 'ceil', ARGV[5],
  'delay', ARGV[6], 'ret', ARGV[7], PAD_FIELD, PAD)
-- Every per-org key gets its pad entry, so that all of them exist from now on (marker()).
redis.call('HSET', KEYS[2], PAD_FIELD, '1')
redis.call('HSET', KEYS[3], PAD_FIELD, PAD)
redis.call('HSET', KEYS[4], PAD_FIELD, '1')
redis.call('ZADD', KEYS[5], '+inf', PAD_FIELD)
redis.call('ZADD', KEYS[6], '0', PAD_MEMBER)
redis.call('ZADD', KEYS[7], '0', PAD_MEMBER)
redis.call('HSET', KEYS[8], PAD_FIELD, '1')
redis.call('HSET', KEYS[9], PAD_FIELD, '1')
if redis.call('EXISTS', KEYS[10]) == 0 then
  -- an empty journal stream (the entry is trimmed at once)
  redis.call('XADD', KEYS[10], 'MAXLEN', '0', '*', 'p', '')
end
redis.call('DEL', KEYS[11])
return {C_OK}
