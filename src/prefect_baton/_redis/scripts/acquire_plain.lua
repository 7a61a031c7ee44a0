-- uses: _acquire.lua
-- acquire_plain.lua: acquire_many.lua for the common request, with less work per resource:
-- no execution key, no write scopes, no expected version, one TTL and one purpose for all.
-- The client sends each resource's new generation text up to its execution key (id, rt,
-- ri, rd, owner, "" joined by NUL, then NUL), so a grant is one concatenation. A resource
-- whose head is free (none, or ended) is granted here (version +1, epoch above the head's
-- and the floor, the head retired); one whose head is still marked active (held, or run
-- out: takeover, conflict or supersede) is decided by decide_acquire as in acquire_many.lua.
-- Every resource is decided before the first write: a refusal writes nothing.
-- KEYS[1..10]: the per-org keys listed in _lib.lua.
-- ARGV[1] principal, ARGV[2] role, ARGV[3] n, ARGV[4] ttl_ms, ARGV[5] purpose ("" or
-- "=" .. purpose), then per resource i, from ARGV[6 + 3 * (i - 1)]: the generation prefix,
-- the resource digest, the new lease id.
-- Returns:
--   {0, journal entry id or "", now_ms, then per resource three values:
--        3, version, epoch       granted here (the client knows the rest of the generation)
--        code, generation, ""    decided by decide_acquire: 0 granted, 1 or 2 as acquire.lua}
--   {code, i, ...}   request i was refused (acquire.lua's reply after the index); nothing
--                    was written
--   {30} / {31}      as acquire.lua
local mk = marker(true)
if not mk then return {C_NO_INCARNATION} end
local now = now_ms()
local principal, role = ARGV[1], ARGV[2]
local n, ttl, p = tonumber(ARGV[3]), N(ARGV[4]), ARGV[5]
local rds = {}
for i = 1, n do rds[i] = ARGV[4 + 3 * i] end
local heads = redis.call('HMGET', KEYS[2], unpack(rds))
-- Everything after the version and epoch is the same for every plain grant of this call.
local tail = table.concat({'active', I(now), I(now + ttl), I(ttl), '', p, '', '', ''}, '\0')
local plans, replies, retired = {}, {}, 0
for i = 1, n do
  local b = 3 + 3 * i
  local raw = heads[i] or nil
  local head = peek(raw)
  if head and head.s == 'active' then
    -- Held or run out: the full decision (takeover, supersede, conflict, no-op).
    local rt, ri = string.match(ARGV[b], '^[^%z]*%z([^%z]*)%z([^%z]*)%z')
    local it = {rd = ARGV[b + 1], rt = rt, ri = ri, ttl = ttl, p = opt(p), id = ARGV[b + 2],
                digest = ''}
    local r = decide_acquire(it, principal, nil, now, mk, raw)
    local stop = stop_at(r, i)
    if stop then return stop end
    if r[1] == C_OK then
      plans[i] = {it = it, plan = r[2]}
    else
      replies[i] = r
    end
  else
    local v, e = 1, mk.floor
    if head then
      if head.v >= MAX_SAFE or head.e >= MAX_SAFE then return {C_INVALID, i, EXHAUSTED} end
      v = head.v + 1
      if head.e > e then e = head.e end
      retired = retired + 1
    end
    if mk.delay > now then return {C_CONFLICT, i, I(mk.delay), 0} end
    e = e + 1
    if e >= mk.ceil then return {C_ROTATE} end
    plans[i] = {v = v, e = e, head = head, raw = raw}
  end
end
local items, out = {}, {C_OK, '', now}
local w = {h = {}, l = {}, o = {}}
local h, l, o = w.h, w.l, w.o
for i = 1, n do
  local pl = plans[i]
  if pl and pl.plan then
    local entry, new_s = apply_acquire(pl.it, pl.plan, principal, nil, now, mk, w)
    items[#items + 1] = entry
    out[#out + 1] = C_OK
    out[#out + 1] = new_s
    out[#out + 1] = ''
  elseif pl then
    local b = 3 + 3 * i
    local rd, id = ARGV[b + 1], ARGV[b + 2]
    if pl.head then retire(pl.head, now, pl.raw) end
    local new_s = table.concat({ARGV[b], I(pl.v), I(pl.e), tail}, '\0')
    h[#h + 1] = rd; h[#h + 1] = new_s
    l[#l + 1] = id; l[#l + 1] = rd
    o[#o + 1] = '0'; o[#o + 1] = principal .. '\0' .. rd
    items[#items + 1] = item('acquire', new_s)
    out[#out + 1] = 3
    out[#out + 1] = pl.v
    out[#out + 1] = pl.e
  else
    out[#out + 1] = replies[i][1]
    out[#out + 1] = replies[i][2]
    out[#out + 1] = ''
  end
end
if retired > 0 then prune_old(now, mk, retired) end
flush_acquired(w)
if #items > 0 then out[2] = journal(mk, principal, role, now, items) end
return out
