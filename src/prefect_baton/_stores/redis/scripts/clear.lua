-- clear.lua: drop what is left of an org's lease state before it is rebuilt from the ledger
-- (the journal has been drained into the ledger first).
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- KEYS[13]: the rebuild lock.
-- KEYS[14..]: more keys of the org to drop (a hand-back's acquire receipt and handoff keys
-- left by an earlier version, which kept them as string keys).
-- ARGV[1] rebuild token; ARGV[2] "pad" before a rebuild restores the ledger's leases: the
-- cleared per-org keys get their pad entries (pad_keys()), whose presence install.lua
-- checks, and rc and rcx are kept when both still exist (what Redis kept there is at least
-- as new as the ledger's receipts, which the rebuild adds where missing, and the handoff
-- resolutions are in Redis alone); absent for a hand-back, which leaves nothing behind.
-- Returns:
--   {0}                                  cleared
--   {32}                                 the rebuild lock was lost, or a marker exists
if redis.call('GET', KEYS[13]) ~= ARGV[1] then return {C_REBUILD_LOST} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {C_REBUILD_LOST} end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9],
  KEYS[10])
if ARGV[2] ~= 'pad' or redis.call('EXISTS', KEYS[11], KEYS[12]) ~= 2 then
  redis.call('DEL', KEYS[11], KEYS[12])
end
for i = 14, #KEYS do redis.call('DEL', KEYS[i]) end
if ARGV[2] == 'pad' then pad_keys() end
return {C_OK}
