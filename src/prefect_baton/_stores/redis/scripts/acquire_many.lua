-- uses: _acquire.lua
-- acquire_many.lua: all-or-nothing acquire of several resources: every request is decided
-- first (as acquire.lua decides one); only when none is refused are they all applied, and
-- one journal entry records them all.
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- ARGV[1] principal, ARGV[2] role, ARGV[3] execution key ("" or "=" .. key), ARGV[4] n,
-- ARGV[5 + 12 * (i - 1) ..]: request i, the twelve fields acquire.lua takes.
-- ARGV[5 + 12 * n]: the attempt token ("" for an anonymous attempt, or "=" .. token).
-- Returns:
--   {0, journal entry id or "", code_1, generation_1, ..., code_n, generation_n}
--        where code_i is 0 (granted), 1 (already held by this execution) or 2 (replayed)
--   {code, i, ...}   request i was refused with acquire.lua's reply {code, ...}; nothing
--                    was written
--   {30} / {31}      as acquire.lua
local mk = marker(true)
if not mk then return {C_NO_INCARNATION} end
local now = now_ms()
local principal, role, key = ARGV[1], ARGV[2], opt(ARGV[3])
local n = tonumber(ARGV[4])
local attempt = opt(ARGV[5 + 12 * n])
local rds = {}
for i = 1, n do rds[i] = ARGV[5 + 12 * (i - 1)] end
local heads = redis.call('HMGET', KEYS[2], unpack(rds))
local its, replies = {}, {}
for i = 1, n do
  local it = read_item(5 + 12 * (i - 1))
  it.at = attempt
  local r = decide_acquire(it, principal, key, now, mk, heads[i] or nil)
  local stop = stop_at(r, i)
  if stop then return stop end
  if r[1] == C_OK then
    it.plan = r[2]
    its[i] = it
  else
    replies[i] = r
  end
end
local items, out = {}, {C_OK, ''}
local w = {h = {}, l = {}, o = {}}
for i = 1, n do
  local it = its[i]
  if it then
    local entry, new_s = apply_acquire(it, it.plan, principal, key, now, mk, w)
    items[#items + 1] = entry
    out[#out + 1] = C_OK
    out[#out + 1] = new_s
  else
    out[#out + 1] = replies[i][1]
    out[#out + 1] = replies[i][2]
  end
end
flush_acquired(w)
if #items > 0 then out[2] = journal(mk, principal, role, now, items) end
return out
