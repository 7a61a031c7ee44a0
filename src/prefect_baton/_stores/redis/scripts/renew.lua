-- renew.lua: extend a lease by proof (mirror of _transitions.decide_renew): version +1,
-- expiry = Redis TIME + ttl; id, owner, key, epoch and scopes unchanged.
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- ARGV[1] principal, ARGV[2] role, ARGV[3] execution key ("" or "=" .. key), ARGV[4] lease id,
-- ARGV[5] ttl_ms, ARGV[6] expected version ("" or "=" .. n), ARGV[7] the earliest deadline
-- of the pending handoffs carrying the lease ("" or "=" .. epoch ms, read from the ledger).
-- Returns:
--   {0, journal entry id, generation}   renewed
--   {11, current, expected}              VERSION_CONFLICT
--   {12, message}                        NOT_FOUND (another principal's lease)
--   {13, message[, status]}              LEASE_LOST (ended, expired, or past a carrying
--                                        handoff's deadline)
--   {18, lease id, held key?, given key?} LEASE_LOST (another execution key: _lib.lua)
--   {15, message}                        VALIDATION_ERROR (version counter exhausted)
--   {20}                                 lease id unknown to Redis (Python asks the ledger)
--   {30}                                 no incarnation marker
local mk = marker()
if not mk then return {C_NO_INCARNATION} end
local now = now_ms()
local principal, key, id = ARGV[1], opt(ARGV[3]), ARGV[4]
local g = gen_by_id(id)
if not g then return {C_UNKNOWN} end
local refused = proof_refused(g, id, principal, key, now) or lost_refused(g, now)
  or carried_deadline_refused(g, opt(ARGV[7]), now) or version_refused(g, opt(ARGV[6]))
if refused then return refused end
if g.v >= MAX_SAFE then return {C_INVALID, EXHAUSTED} end
local ttl = tonumber(ARGV[5])
g.v = g.v + 1
g.x = now + ttl
g.t = ttl
local json = enc(g)
redis.call('HSET', KEYS[2], g.rd, json)
if g.sid then redis.call('HSET', KEYS[9], g.sid, I(g.x) .. '\0' .. g.o) end
local eid = journal(mk, principal, ARGV[2], now, {item('renew', json)})
return {C_OK, eid, json}
