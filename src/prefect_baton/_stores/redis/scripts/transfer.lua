-- transfer.lua: hand a lease to another principal (mirror of _transitions.decide_transfer): new
-- lease id, version +1, epoch +1 (at least the incarnation's floor + 1), owner and key
-- replaced, scopes kept. In handoff mode (ARGV[11] given) it also settles the handoff's
-- resolution (its field in rc), so that accept and reject of one handoff can never both win, and an
-- exact retry of an accepted handoff returns the generation it created.
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- ARGV[1] sender principal (proof owner), ARGV[2] actor role, ARGV[3] execution key
--   ("" or "=" .. key; ignored in handoff mode, where the lease's own key is the proof),
-- ARGV[4] lease id, ARGV[5] receiver, ARGV[6] receiver's execution key,
-- ARGV[7] ttl_ms ("" = the lease's ttl), ARGV[8] expected version ("" or "=" .. n),
-- ARGV[9] new lease id, ARGV[10] actor principal (recorded in the journal),
-- ARGV[11] handoff id ("" or "=" .. id), ARGV[12] handoff note ("" or "=" .. note),
-- ARGV[13] handoff expires_at_ms ("" or "=" .. ms), ARGV[14] how long the resolution is
-- kept (ms), ARGV[15] the earliest deadline of the pending handoffs carrying the lease (""
-- or "=" .. epoch ms, read from the ledger; see renew.lua), ARGV[16] the field of rc
-- holding the handoff's resolution (handoff mode only).
-- Returns:
--   {0, journal entry id, generation}   transferred
--   {2, generation}                      handoff mode: already accepted by this handoff
--   {10, expires_at_ms, 0|1}             CONFLICT (post-loss lock delay, or 1: a scope)
--   {11, current, expected}              VERSION_CONFLICT
--   {12, message}                        NOT_FOUND
--   {13, message[, status]}              LEASE_LOST (ended, expired, or past a carrying
--                                        handoff's deadline)
--   {18, lease id, held key?, given key?} LEASE_LOST (another execution key: _lib.lua)
--   {15, message}                        VALIDATION_ERROR
--   {20}                                 lease id unknown to Redis
--   {30} / {31}                          as acquire.lua
local mk = marker(true)
if not mk then return {C_NO_INCARNATION} end
local now = now_ms()
local principal, id, to, nkey, nid = ARGV[1], ARGV[4], ARGV[5], ARGV[6], ARGV[9]
local hid = opt(ARGV[11])
if hid then
  local res = kept(ARGV[16], now)
  if res then
    if res == 'a:' .. nid then
      local done = gen_by_id(nid)
      if done then return {C_REPLAY, enc(done)} end
    end
    return {C_NOT_FOUND, 'pending handoff ' .. hid .. ' not found'}
  end
  local hexp = opt(ARGV[13])
  if hexp and tonumber(hexp) <= now then
    return {C_NOT_FOUND, 'handoff ' .. hid .. ' has expired'}
  end
end
local g = gen_by_id(id)
if not g then return {C_UNKNOWN} end
local key = opt(ARGV[3])
if hid then key = g.k end
local refused = proof_refused(g, id, principal, key, now) or lost_refused(g, now)
  or carried_deadline_refused(g, opt(ARGV[15]), now) or version_refused(g, opt(ARGV[8]))
if refused then return refused end
if nkey == g.k then
  return {C_INVALID, 'transfer needs a new execution key for the receiver'}
end
if g.sid then
  local m = cjson.decode(redis.call('HGET', KEYS[8], g.sid))
  local exp, costly = S().scope_conflict(m.pf, m.t, to, g.rd, now)
  if costly then return {C_SCOPE_STEPS} end
  if exp then return {C_CONFLICT, I(exp), 1} end
end
if g.v >= MAX_SAFE or g.e >= MAX_SAFE then return {C_INVALID, EXHAUSTED} end
if mk.delay > now then return {C_CONFLICT, I(mk.delay), 0} end
local epoch = g.e
if mk.floor > epoch then epoch = mk.floor end
epoch = epoch + 1
if epoch >= mk.ceil then return {C_ROTATE} end
local ttl = g.t
if ARGV[7] ~= '' then ttl = tonumber(ARGV[7]) end
local ended = copy(g)
ended.s = 'transferred'
ended.ea = now
local new = copy(g)
new.id = nid
new.o = to
new.k = nkey
new.v = g.v + 1
new.e = epoch
new.a = now
new.x = now + ttl
new.t = ttl
new.s = 'active'
new.ea = nil
new.eb = nil
local ended_json, new_json = enc(ended), enc(new)
retire(ended, now, ended_json)
prune_old(now, mk, 1)
redis.call('HSET', KEYS[2], g.rd, new_json)
redis.call('HSET', KEYS[3], nid, g.rd)
redis.call('ZREM', KEYS[6], own_member(g))
redis.call('ZADD', KEYS[6], '0', own_member(new))
if g.sid then redis.call('HSET', KEYS[9], g.sid, I(new.x) .. '\0' .. to) end
if hid then keep(ARGV[16], 'a:' .. nid, tonumber(ARGV[14]), now) end
local eid = journal(mk, ARGV[10], ARGV[2], now, {item('transfer', new_json, ended_json)}, hid,
  opt(ARGV[12]))
return {C_OK, eid, new_json}
