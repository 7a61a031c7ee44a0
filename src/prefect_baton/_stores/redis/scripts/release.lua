-- release.lua: release a lease by proof (mirror of _transitions.decide_release): an
-- effective lease ends "released", one past its expiry that nobody took ends "expired" (but
-- "released" when an expired handoff carrying it releases it, see below); a
-- lease already released by this proof is a durable no_change. Version and epoch are kept.
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- ARGV[1] principal, ARGV[2] role, ARGV[3] execution key ("" or "=" .. key), ARGV[4] lease id,
-- ARGV[5] expected version ("" or "=" .. n), ARGV[6] the handoff whose end releases it ("" or
-- absent: none; else "=" .. id) and ARGV[7] the reason ("=" .. reason), kept in the journal
-- entry's handoff fields so that the ledger's lease.released names them.
-- Returns:
--   {0, journal entry id, generation}   released (the generation's status says how)
--   {1, generation}                      no_change: already released/expired (no write)
--   {11, current, expected}              VERSION_CONFLICT
--   {12, message}                        NOT_FOUND (another principal's, or superseded)
--   {13, message[, status]}              LEASE_LOST (another execution, or taken since)
--   {18, lease id, held key?, given key?} LEASE_LOST (another execution key: _lib.lua)
--   {20}                                 lease id unknown to Redis (Python asks the ledger)
--   {30}                                 no incarnation marker
local mk = marker()
if not mk then return {C_NO_INCARNATION} end
local now = now_ms()
local principal, key, id = ARGV[1], opt(ARGV[3]), ARGV[4]
local g = gen_by_id(id, true)
if not g then return {C_UNKNOWN} end
local refused = proof_refused(g, id, principal, key, now) or version_refused(g, opt(ARGV[5]))
if refused then return refused end
if g.s == 'released' or g.s == 'expired' then return {C_NOOP, g.raw or enc(g)} end
if g.s == 'superseded' then return {C_NOT_FOUND, 'lease ' .. id .. ' not found'} end
if g.s ~= 'active' then
  return {C_LOST, 'lease ' .. g.id .. ' is no longer held (' .. g.s .. ')', g.s}
end
local sid = g.sid
local st = 'expired'
-- a release for an expired handoff (reason handoff_expired) is asked for a lease past its
-- TTL only when the handoff's deadline came first (_rules.handoffs.decide_carried_release):
-- it ends released, as that rule decides, never expired
if g.x > now or opt(ARGV[7]) == 'handoff_expired' then st = 'released' end
local json
if g.raw then
  json = ended_text(g, st, now)
else  -- a legacy JSON generation
  g.s, g.ea, g.sid = st, now, nil
  json = enc(g)
end
redis.call('HSET', KEYS[2], g.rd, json)
redis.call('ZREM', KEYS[6], own_member(g))
if sid then S().idx_remove(sid) end
local eid = journal(mk, principal, ARGV[2], now, {item('release', json)}, opt(ARGV[6]),
  opt(ARGV[7]))
return {C_OK, eid, json}
