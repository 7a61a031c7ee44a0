-- force_release.lua: end anyone's active lease of the org as "revoked", recording who forced
-- it (mirror of _transitions.decide_force_release). Needs the owner or admin role.
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- ARGV[1] principal, ARGV[2] role, ARGV[3] lease id.
-- Returns:
--   {0, journal entry id, generation}   revoked
--   {12, message}                        NOT_FOUND (not active or unknown)
--   {16, message}                        FORBIDDEN (role is agent)
--   {30}                                 no incarnation marker
local mk = marker()
if not mk then return {C_NO_INCARNATION} end
if ARGV[2] ~= 'owner' and ARGV[2] ~= 'admin' then
  return {C_FORBIDDEN, 'force release needs the owner or admin role'}
end
local now = now_ms()
local id = ARGV[3]
local g = gen_by_id(id)
if not g or g.s ~= 'active' then return {C_NOT_FOUND, 'lease ' .. id .. ' not found'} end
local sid = g.sid
g.s = 'revoked'
g.ea = now
g.eb = ARGV[1]
g.sid = nil
local json = enc(g)
redis.call('HSET', KEYS[2], g.rd, json)
redis.call('ZREM', KEYS[6], own_member(g))
if sid then S().idx_remove(sid) end
local eid = journal(mk, ARGV[1], ARGV[2], now, {item('force_release', json)})
return {C_OK, eid, json}
