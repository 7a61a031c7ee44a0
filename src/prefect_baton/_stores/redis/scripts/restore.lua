-- restore.lua: load generations read from the ledger while rebuilding after data loss.
-- Runs only while the caller holds the rebuild lock and no incarnation marker exists.
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- KEYS[13]: the rebuild lock.
-- ARGV[1] rebuild token, then pairs ARGV[2i], ARGV[2i+1]: a head generation (the text form
-- of _lib.lua, with rd and, when scoped and active, sid) and its scope meta JSON {r, t, pf}
-- ("" when unscoped).
-- Returns:
--   {0}                                  loaded
--   {32}                                 the rebuild lock was lost (someone else rebuilds)
if redis.call('GET', KEYS[13]) ~= ARGV[1] then return {C_REBUILD_LOST} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {C_REBUILD_LOST} end
for i = 2, #ARGV, 2 do
  local g = dec(ARGV[i])
  redis.call('HSET', KEYS[2], g.rd, ARGV[i])
  redis.call('HSET', KEYS[3], g.id, g.rd)
  if g.s == 'active' then
    redis.call('ZADD', KEYS[6], '0', own_member(g))
    if ARGV[i + 1] ~= '' then
      local m = cjson.decode(ARGV[i + 1])
      S().idx_add(g.sid, ARGV[i + 1], m.pf, g.x, g.o)
    end
  end
end
return {C_OK}
