-- unlock.lua: drop the rebuild lock if it is still the caller's (compare and delete).
-- KEYS[1]: the rebuild lock.
-- ARGV[1] rebuild token.
-- Returns: {0} dropped, {32} it was not the caller's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {C_OK}
end
return {C_REBUILD_LOST}
