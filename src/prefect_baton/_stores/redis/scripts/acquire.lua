-- uses: _acquire.lua
-- acquire.lua: acquire or take over one resource (mirror of _core.decide_acquire plus the
-- ledger's receipt check), register its write scopes, append the transition to the journal.
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- ARGV[1] principal, ARGV[2] role, ARGV[3] execution key ("" or "=" .. key),
-- ARGV[4..15] the request (see read_item): resource digest, resource type, resource id,
--   ttl_ms, purpose (optional), expected version (optional), new lease id, request digest,
--   scopes JSON ("" when none), scope meta JSON {r, t, pf}, receipt ttl_ms, the receipt's
--   field in rc ("" without an execution key).
-- ARGV[16] the attempt token ("" for an anonymous attempt, or "=" .. token).
-- Returns:
--   {0, journal entry id, generation}   granted (acquire, takeover or supersede)
--   {1, generation}                      the same execution already holds it (no write)
--   {2, generation}                      an exact retry: the receipt's lease, still held
--   {10, expires_at_ms, 0|1}             CONFLICT (1: a write scope overlaps)
--   {11, current, expected}              VERSION_CONFLICT
--   {13, message[, status]}              LEASE_LOST (replay of a lost lease)
--   {14, key}                            IDEMPOTENCY_MISMATCH
--   {17, key, expires_at_ms}             IDEMPOTENCY_IN_FLIGHT (another attempt holds it)
--   {15, message}                        VALIDATION_ERROR (counters exhausted)
--   {30}                                 no incarnation marker: Redis lost its data
--   {31}                                 the incarnation's epoch range is used up
local mk = marker(true)
if not mk then return {C_NO_INCARNATION} end
local now = now_ms()
local principal, role, key = ARGV[1], ARGV[2], opt(ARGV[3])
local it = read_item(4)
it.at = opt(ARGV[16])
local r = decide_acquire(it, principal, key, now, mk, redis.call('HGET', KEYS[2], it.rd))
if r[1] ~= C_OK then return r end
local entry, new_s = apply_acquire(it, r[2], principal, key, now, mk, nil)
local eid = journal(mk, principal, role, now, {entry})
return {C_OK, eid, new_s}
