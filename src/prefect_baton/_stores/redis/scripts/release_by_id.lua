-- release_by_id.lua: release by lease id alone, as its owner (mirror of
-- _transitions.decide_release_by_id); a lease that is not active, unknown or another principal's
-- is not found.
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- ARGV[1] principal, ARGV[2] role, ARGV[3] lease id.
-- Returns:
--   {0, journal entry id, generation}   released ("released", or "expired" if it had run out)
--   {12, message}                        NOT_FOUND
--   {30}                                 no incarnation marker
local mk = marker()
if not mk then return {C_NO_INCARNATION} end
local now = now_ms()
local principal, id = ARGV[1], ARGV[3]
local g = gen_by_id(id)
if not g or g.o ~= principal or g.s ~= 'active' then
  return {C_NOT_FOUND, 'lease ' .. id .. ' not found'}
end
local sid = g.sid
if g.x > now then g.s = 'released' else g.s = 'expired' end
g.ea = now
g.sid = nil
local json = enc(g)
redis.call('HSET', KEYS[2], g.rd, json)
redis.call('ZREM', KEYS[6], own_member(g))
if sid then S().idx_remove(sid) end
local eid = journal(mk, principal, ARGV[2], now, {item('release', json)})
return {C_OK, eid, json}
