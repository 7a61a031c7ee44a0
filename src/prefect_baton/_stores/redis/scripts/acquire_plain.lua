-- uses: _acquire.lua
-- acquire_plain.lua: acquire_many.lua for the common request, with less work per resource:
-- no execution key, no write scopes, no expected version, one TTL and one purpose for all.
-- The client sends each resource's new generation text up to its execution key (id, rt,
-- ri, rd, owner, "" joined by NUL, then NUL), so a grant is one concatenation. A resource
-- whose head is free (none, or ended) is granted here (version +1, epoch above the head's
-- and the floor, the head retired); one whose head is still marked active (held, or run
-- out: takeover, conflict or supersede) is decided by decide_acquire as in acquire_many.lua.
-- Every resource is decided before the first write: a refusal writes nothing.
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
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
-- Decisions, in arrays rather than a table per resource (fewer allocations per lease):
-- a free resource gets its version and epoch in pv/pe (and its retired head in ph/praw);
-- one decided by decide_acquire gets its item and plan in full, or its reply in replies.
local pv, pe, ph, praw, full, replies, retired = {}, {}, {}, {}, {}, {}, 0
for i = 1, n do
  local b = 3 + 3 * i
  local raw = heads[i] or nil
  local head = peek(raw)
  if head and head.s == 'active' then
    -- Held or run out: the full decision (takeover, supersede, conflict, no-op).
    local rt, ri = string.match(ARGV[b], '^%Z*%z(%Z*)%z(%Z*)%z')
    local it = {rd = ARGV[b + 1], rt = rt, ri = ri, ttl = ttl, p = opt(p), id = ARGV[b + 2],
                digest = ''}
    local r = decide_acquire(it, principal, nil, now, mk, raw)
    local stop = stop_at(r, i)
    if stop then return stop end
    if r[1] == C_OK then
      full[i] = {it, r[2]}
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
      ph[i], praw[i] = head, raw
    end
    if mk.delay > now then return {C_CONFLICT, i, I(mk.delay), 0} end
    e = e + 1
    if e >= mk.ceil then return {C_ROTATE} end
    pv[i], pe[i] = v, e
  end
end
-- The journal entry's pieces: seven header slots, then five per granted resource.
local parts, count, out = {false, false, false, false, false, false, false}, 0, {C_OK, '', now}
local w = {h = {}, l = {}, o = {}}
local h, l, o = w.h, w.l, w.o
local np, nh, no = 7, 0, 0
for i = 1, n do
  local v = pv[i]
  if v then
    local b = 3 + 3 * i
    local rd = ARGV[b + 1]
    if ph[i] then retire(ph[i], now, praw[i]) end
    local e = pe[i]
    local new_s = ARGV[b] .. '\0' .. I(v) .. '\0' .. I(e) .. '\0' .. tail
    h[nh + 1], h[nh + 2], l[nh + 1], l[nh + 2] = rd, new_s, ARGV[b + 2], rd
    o[no + 1], o[no + 2] = '0', principal .. '\0' .. rd
    nh, no = nh + 2, no + 2
    parts[np + 1], parts[np + 2], parts[np + 3], parts[np + 4], parts[np + 5] =
      'acquire', '', '', new_s, NO_GEN
    np, count = np + 5, count + 1
    out[#out + 1] = 3
    out[#out + 1] = v
    out[#out + 1] = e
  elseif full[i] then
    local entry, new_s = apply_acquire(full[i][1], full[i][2], principal, nil, now, mk, w)
    nh, no = #h, #o
    parts[np + 1], parts[np + 2], parts[np + 3], parts[np + 4], parts[np + 5] =
      entry[1], entry[2], entry[3], entry[4], entry[5]
    np, count = np + 5, count + 1
    out[#out + 1] = C_OK
    out[#out + 1] = new_s
    out[#out + 1] = ''
  else
    out[#out + 1] = replies[i][1]
    out[#out + 1] = replies[i][2]
    out[#out + 1] = ''
  end
end
if retired > 0 then prune_old(now, mk, retired) end
flush_acquired(w)
if count > 0 then out[2] = journal_parts(mk, principal, role, now, parts, count) end
return out
