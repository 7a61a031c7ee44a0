-- _lib.lua: helpers shared by every prefect-baton script. Python prepends this file to each
-- operation script before registering it, so each registered script is self-contained; the
-- function library (FUNCTION LOAD) holds it once, with each operation as a function (see
-- scripts.py). Top-level statements here must not call library functions: Redis runs them
-- when it loads the library, where only redis.register_function is available.
--
-- Every operation script receives the same twelve per-org keys first (all share the org's
-- hash tag, so the scripts run unchanged on Redis Cluster):
--   KEYS[1]  inc    hash: incarnation marker (id, n, floor, ceil, delay, ret, PAD_FIELD)
--   KEYS[2]  heads  hash: resource digest -> newest generation of the resource
--   KEYS[3]  lid    hash: lease id -> resource digest (every generation not yet pruned),
--                   and PAD_FIELD
--   KEYS[4]  old    hash: lease id -> a generation that is no longer its resource's head
--   KEYS[5]  oldx   zset: lease id of `old` by ended_at_ms (pruning)
--   KEYS[6]  own    zset (lex): owner .. "\0" .. resource digest of every active head
--   KEYS[7]  sx     zset (lex): literal scope prefix .. "\0" .. sid of every scoped active lease
--   KEYS[8]  sl     hash: sid -> {"r": resource digest, "t": scope tokens, "pf": prefixes}
--   KEYS[9]  se     hash: sid -> expires_at_ms .. "\0" .. owner
--   KEYS[10] j      stream: the journal the reconciler drains into the ledger
--   KEYS[11] rc     hash: what the org keeps for a while (kept(), keep()): acquire receipts
--                   ("i:" .. digest) and lease-carrying handoffs' resolutions ("h:" .. digest)
--   KEYS[12] rcx    zset: the fields of rc by expiry (epoch ms)
--
-- From install.lua on, every one of these keys exists: each hash holds PAD_FIELD, each
-- sorted set a pad member (PAD_MEMBER in own and sx, which no lexicographic range of the
-- scripts reaches; PAD_FIELD at score +inf in oldx and rcx, which pruning never reaches), and the
-- journal stays as an empty stream when trimmed. marker() checks that they all exist
-- before anything is decided, so the loss of any subset of them is seen (see marker()).
--
-- A generation is one string of 17 fields separated by NUL ("\0"; no id, free text or
-- scope may contain NUL), in this order: id, rt, ri, rd (resource digest), o (owner),
-- k (execution key), v (version), e (epoch), s (status), a (acquired_at_ms),
-- x (expires_at_ms), t (ttl_ms), sc (scopes as a JSON list), p (purpose), ea (ended_at_ms),
-- eb (ended_by), sid (scope registration id). Integers are decimal; an empty field means
-- None, except p, which is "=" .. purpose when set (a purpose may be ""). Generations
-- written by earlier versions as JSON objects (first byte "{") are still read.
-- Optional string ARGV use "" for None and "=" .. value otherwise.
--
-- A journal entry is one stream field "p": NUL-separated fields, the header (incarnation id,
-- actor, role, at_ms, handoff id or "", handoff note ("" or "=" .. note), item count), then
-- per item: action, receipt request digest or "" (followed by "|" .. attempt token when the
-- acquire named its attempt), receipt expires_at_ms or "", the new
-- generation's 17 fields, the ended generation's 17 fields (all empty when none).
--
-- Scripts decide everything before their first write, so a refused request writes nothing.

local C_OK, C_NOOP, C_REPLAY = 0, 1, 2
local C_CONFLICT, C_VERSION, C_NOT_FOUND, C_LOST = 10, 11, 12, 13
local C_MISMATCH, C_INVALID, C_FORBIDDEN, C_IN_FLIGHT, C_UNKNOWN = 14, 15, 16, 17, 20
local C_WRONG_KEY, C_SCOPE_STEPS = 18, 19
local C_NO_INCARNATION, C_ROTATE, C_REBUILD_LOST = 30, 31, 32
local MAX_SAFE = 9007199254740991
-- prefect_baton._rules.scopes.SCOPE_CHECK_STEPS (tests/unit/test_scopes.py checks they agree)
local SCOPE_CHECK_STEPS = 100000
local EXHAUSTED = 'lease generation counters are exhausted (2**53 - 1); only release is allowed'
local NUMS = {'v', 'e', 'a', 'x', 't', 'ea'}
-- install.lua gives `inc` and `lid` one field (no lease id contains NUL) whose value is longer
-- than hash-max-listpack-value (64 bytes by default), so Redis keeps them as hash tables:
-- as listpacks (up to hash-max-listpack-entries, 512 by default) every read of `lid` scanned
-- the list, up to 45,000 instructions in an org with a few hundred generations.
local PAD_FIELD = '\0pad'
local PAD = 'a value longer than 64 bytes keeps this hash a hash table, not a listpack'
-- The pad member of the lexicographic sets own and sx: byte 255 never occurs in UTF-8, so
-- no owner, scope prefix or range of one starts with it.
local PAD_MEMBER = '\255'

-- The steps left to this script call's write-scope comparisons
-- (prefect_baton._rules.scopes.ScopeCheckBudget: one per state of the overlap walk worked
-- out, in the order Python works them out); reset with _ints at each call.
local _scope_steps = SCOPE_CHECK_STEPS

-- An integer as decimal text (exact up to 2**53), remembered for the call: the scripts
-- format the same times (now, expiries) again and again.
local _ints = {}
local function I(n)
  local t = _ints[n]
  if not t then
    t = string.format('%d', n)
    _ints[n] = t
  end
  return t
end

local function opt(s)
  if s == nil or s == false or s == '' then return nil end
  return string.sub(s, 2)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whether every key of KEYS[2..12] exists (they all do from install.lua on). When one is
-- missing (evicted under an allkeys-* policy, deleted), the marker is deleted in this same
-- call: the org's state counts as lost, as after a restart without persistence, so this
-- and every later operation fails closed until it is rebuilt from the ledger, with epochs
-- above every epoch handed out (rebuild.py). No decision is ever made on partial state.
local function intact()
  if redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8],
      KEYS[9], KEYS[10], KEYS[11], KEYS[12]) == 11 then
    return true
  end
  redis.call('DEL', KEYS[1])
  return false
end

-- Give every key of KEYS[2..12] its pad entry (the journal: an empty stream), so that all
-- of them exist. clear.lua does it before a rebuild restores anything and install.lua
-- checks that they all still exist before it sets the marker: a key evicted or deleted
-- while the rebuild loaded the ledger's leases is then seen, and the rebuild is retried,
-- instead of a marker installed over state with held resources missing.
local function pad_keys()
  redis.call('HSET', KEYS[2], PAD_FIELD, '1')
  redis.call('HSET', KEYS[3], PAD_FIELD, PAD)
  redis.call('HSET', KEYS[4], PAD_FIELD, '1')
  redis.call('ZADD', KEYS[5], '+inf', PAD_FIELD)
  redis.call('ZADD', KEYS[6], '0', PAD_MEMBER)
  redis.call('ZADD', KEYS[7], '0', PAD_MEMBER)
  redis.call('HSET', KEYS[8], PAD_FIELD, '1')
  redis.call('HSET', KEYS[9], PAD_FIELD, '1')
  redis.call('HSET', KEYS[11], PAD_FIELD, PAD)
  redis.call('ZADD', KEYS[12], '+inf', PAD_FIELD)
  if redis.call('EXISTS', KEYS[10]) == 0 then
    -- an empty journal stream (the entry is trimmed at once)
    redis.call('XADD', KEYS[10], 'MAXLEN', '0', '*', 'p', '')
  end
end

-- The incarnation marker, or nil when Redis lost the org's state, in whole or in part
-- (intact()). Operations that grant (full = true) read its numbers too; the others only
-- its id.
local function marker(full)
  if not full then
    local id = redis.call('HGET', KEYS[1], 'id')
    if not id or not intact() then return nil end
    return {id = id}
  end
  local m = redis.call('HMGET', KEYS[1], 'id', 'floor', 'ceil', 'delay', 'ret')
  if not m[1] or not intact() then return nil end
  return {id = m[1], floor = tonumber(m[2]), ceil = tonumber(m[3]),
          delay = tonumber(m[4]) or 0, ret = m[5]}
end

local F = {'id', 'rt', 'ri', 'rd', 'o', 'k', 'v', 'e', 's', 'a', 'x', 't', 'sc', 'p', 'ea',
           'eb', 'sid'}
local NO_GEN = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'

-- A generation written as JSON by an earlier version.
local function dec_json(s)
  local g = cjson.decode(s)
  for _, f in ipairs(NUMS) do
    if g[f] ~= nil then g[f] = tonumber(g[f]) end
  end
  if type(g.sc) == 'table' then g.sc = cjson.encode(g.sc) end
  return g
end

-- The 17 fields of a generation (Lua 5.1 patterns match NUL as %z).
local GEN_PAT = '^(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(.*)$'

-- A numeric field: the number, with its text remembered for I() (formatting is costly).
local function N(text)
  local n = tonumber(text)
  _ints[n] = text
  return n
end

local function dec(s)
  if not s then return nil end
  if string.byte(s, 1) == 123 then return dec_json(s) end
  local id, rt, ri, rd, o, k, v, e, st, a, x, t, sc, p, ea, eb, sid = string.match(s, GEN_PAT)
  if k == '' then k = nil end
  if sc == '' then sc = nil end
  if p == '' then p = nil else p = string.sub(p, 2) end
  if ea == '' then ea = nil else ea = N(ea) end
  if eb == '' then eb = nil end
  if sid == '' then sid = nil end
  return {id = id, rt = rt, ri = ri, rd = rd, o = o, k = k, v = N(v), e = N(e), s = st,
          a = N(a), x = N(x), t = N(t), sc = sc, p = p, ea = ea, eb = eb, sid = sid}
end

-- The fields a decision reads, without creating the others (each field split off costs
-- about as much as a command): id, rd, o, k, v, e, s, x, ea (text), eb, sid, plus `raw` and
-- the positions around s (ps, pe) and of ea (pea), from which released() rebuilds the text.
-- A legacy JSON generation is decoded in full (it has no positions).
local PEEK_PAT = '^(%Z*)%z%Z*%z%Z*%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z()(%Z*)()%z%Z*%z(%Z*)%z%Z*%z%Z*%z%Z*%z()(%Z*)%z(%Z*)%z(.*)$'

local function peek(s)
  if not s then return nil end
  if string.byte(s, 1) == 123 then return dec_json(s) end
  local id, rd, o, k, v, e, ps, st, pe, x, pea, ea, eb, sid = string.match(s, PEEK_PAT)
  if k == '' then k = nil end
  if ea == '' then ea = nil end
  if eb == '' then eb = nil end
  if sid == '' then sid = nil end
  return {id = id, rd = rd, o = o, k = k, v = N(v), e = N(e), s = st, x = N(x), ea = ea,
          eb = eb, sid = sid, raw = s, ps = ps, pe = pe, pea = pea}
end

-- The text of generation g (from peek) ended with status `st` at `now`: its scope
-- registration dropped, everything else as stored.
local function ended_text(g, st, now)
  return table.concat({string.sub(g.raw, 1, g.ps - 1), st, string.sub(g.raw, g.pe, g.pea - 1),
    I(now), '\0', g.eb or '', '\0'})
end

local function enc(g)
  local p, ea = '', ''
  if g.p then p = '=' .. g.p end
  if g.ea then ea = I(g.ea) end
  return table.concat({g.id, g.rt, g.ri, g.rd, g.o, g.k or '', I(g.v), I(g.e), g.s, I(g.a),
    I(g.x), I(g.t), g.sc or '', p, ea, g.eb or '', g.sid or ''}, '\0')
end

local function copy(g)
  local o = {}
  for k, val in pairs(g) do o[k] = val end
  return o
end

local function effective(g, now)
  return g.s == 'active' and g.x > now
end

local function lost_reason(g, now)
  if g.s == 'active' and g.x <= now then return 'expired' end
  return g.s
end

-- The generation with lease id `id`, and whether it is its resource's head.
-- With `fast`, the generation is peek()ed (its fields for a decision only).
local function gen_by_id(id, fast)
  local rd = redis.call('HGET', KEYS[3], id)
  if not rd then return nil, false end
  local read = dec
  if fast then read = peek end
  local h = read(redis.call('HGET', KEYS[2], rd))
  if h and h.id == id then return h, true end
  return read(redis.call('HGET', KEYS[4], id)), false
end

-- The refusals of a lease presented by proof (mirrors of _transitions' proof checks), each
-- nil when the check passes: generation g of lease `id` is no longer held at `now`
-- (LEASE_LOST: _transitions.no_longer_held), ...
local function lost_refused(g, now)
  if not effective(g, now) then
    local why = lost_reason(g, now)
    return {C_LOST, 'lease ' .. g.id .. ' is no longer held (' .. why .. ')', why}
  end
end

-- ... is another principal's (NOT_FOUND) or another execution's (LEASE_LOST, `key` being
-- the proof's execution key: one no longer held at `now` says so, as lost_refused; else
-- Python words it: _transitions.wrong_execution_key, from whether the lease and the proof
-- have a key), ...
local function proof_refused(g, id, principal, key, now)
  if g.o ~= principal then return {C_NOT_FOUND, 'lease ' .. id .. ' not found'} end
  if g.k ~= key then
    local lost = lost_refused(g, now)
    if lost then return lost end
    local held, given = 0, 0
    if g.k then held = 1 end
    if key then given = 1 end
    return {C_WRONG_KEY, id, held, given}
  end
end

-- ... or is carried by a pending handoff whose earliest deadline `dl` (epoch ms, from the
-- ledger; nil: none) has passed at `now` (LEASE_LOST: mirror of
-- _core.handoff_deadline_passed as _transitions._check_held applies it; the handoff's end
-- releases it, so the status is 'released'), ...
local function carried_deadline_refused(g, dl, now)
  if dl and tonumber(dl) <= now then
    return {C_LOST, 'lease ' .. g.id .. ' is no longer held (released: the handoff carrying '
      .. 'it expired unaccepted)', 'released'}
  end
end

-- ... or has another version than the expected one `ev` (nil: any; VERSION_CONFLICT).
local function version_refused(g, ev)
  if ev and tonumber(ev) ~= g.v then return {C_VERSION, I(g.v), ev} end
end

-- ------------------------------------------------------------------ write scopes (lazy)
-- The overlap check and the scope index are built on first use only, so calls that touch no
-- scoped lease do not pay for defining them.
local _scopes_lib = nil
local function S()
  if _scopes_lib then return _scopes_lib end
  -- ------------------------------------------------------------------ write-scope overlap
  -- A mirror of prefect_baton._rules.scopes.scopes_overlap over tokens that Python computed with
  -- the same tokenizer: a scope is a list of segments; a segment is the string "**" or a list
  -- of tokens {0, codepoint} (literal), {1} (?), {2} (*), {3, negated, lo, hi, lo, hi, ...}.
  
  local function in_class(ch, tok)
    local hit = false
    for i = 3, #tok, 2 do
      if tok[i] <= ch and ch <= tok[i + 1] then hit = true; break end
    end
    return hit ~= (tok[2] == 1)
  end

  -- Whether some code point from lo to hi lies in none of the ranges r (a flat list lo, hi,
  -- lo, hi, ... from index `from`, sorted by lo): _rules.scopes._gap.
  local function gap(lo, hi, r, from)
    local c = lo
    for k = from, #r, 2 do
      if r[k + 1] >= c then
        if r[k] > c then return true end
        c = r[k + 1] + 1
        if c > hi then return false end
      end
    end
    return c <= hi
  end

  -- Whether some character lies in both classes x and y (_rules.scopes._classes_meet); a
  -- class's ranges come sorted by their first code point (codec._token).
  local function classes_meet(x, y)
    if x[2] == 1 and y[2] == 1 then
      local pairs_ = {}
      for i = 3, #x, 2 do pairs_[#pairs_ + 1] = {x[i], x[i + 1]} end
      for i = 3, #y, 2 do pairs_[#pairs_ + 1] = {y[i], y[i + 1]} end
      table.sort(pairs_, function(p, q)
        if p[1] ~= q[1] then return p[1] < q[1] end
        return p[2] < q[2]
      end)
      local flat = {}
      for _, p in ipairs(pairs_) do flat[#flat + 1] = p[1]; flat[#flat + 1] = p[2] end
      return gap(0, 1114111, flat, 1)
    end
    if x[2] == 1 then x, y = y, x end
    for i = 3, #x, 2 do
      local lo, hi = x[i], x[i + 1]
      if lo <= hi then
        if y[2] == 1 then
          if gap(lo, hi, y, 3) then return true end
        else
          for k = 3, #y, 2 do
            if math.max(lo, y[k]) <= math.min(hi, y[k + 1]) then return true end
          end
        end
      end
    end
    return false
  end

  local function chars_compatible(a, b)
    if a[1] == 1 or b[1] == 1 then return true end
    if a[1] == 0 and b[1] == 0 then return a[2] == b[2] end
    if a[1] == 0 then return in_class(a[2], b) end
    if b[1] == 0 then return in_class(b[2], a) end
    return classes_meet(a, b)
  end

  -- The steps, beyond the state's own, of comparing two single-character tokens
  -- (_rules.scopes._chars_cost): with a class, the product of the range counts.
  local function chars_cost(a, b)
    if a[1] ~= 3 and b[1] ~= 3 then return 0 end
    local na, nb = 1, 1
    if a[1] == 3 then na = (#a - 2) / 2 end
    if b[1] == 3 then nb = (#b - 2) / 2 end
    return na * nb
  end

  -- Running out of _scope_steps raises OUT_OF_STEPS, which scope_conflict catches.
  local OUT_OF_STEPS = {}

  -- Whether some text matches both patterns ta and tb, given as item lists in which an
  -- item for which is_star holds matches any run of items and two other items match a
  -- common item when compatible(x, y): the one rule of segments and of whole scopes.
  local function overlap(ta, tb, is_star, compatible, cost)
    local na, nb = #ta, #tb
    local memo = {}
    local function go(i, j)
      local key = i * (nb + 1) + j
      local m = memo[key]
      if m ~= nil then return m end
      local r
      if i == na and j == nb then
        r = true
      elseif i < na and is_star(ta[i + 1]) then
        r = go(i + 1, j) or (j < nb and go(i, j + 1))
      elseif j < nb and is_star(tb[j + 1]) then
        r = go(i, j + 1) or (i < na and go(i + 1, j))
      elseif i == na or j == nb then
        r = false
      else
        if cost then
          _scope_steps = _scope_steps - cost(ta[i + 1], tb[j + 1])
          if _scope_steps < 0 then error(OUT_OF_STEPS) end
        end
        r = compatible(ta[i + 1], tb[j + 1]) and go(i + 1, j + 1)
      end
      _scope_steps = _scope_steps - 1
      if _scope_steps < 0 then error(OUT_OF_STEPS) end
      memo[key] = r
      return r
    end
    return go(0, 0)
  end

  local function star_token(t) return t[1] == 2 end
  local function globstar(seg) return seg == '**' end

  local function seg_overlap(ta, tb)
    return overlap(ta, tb, star_token, chars_compatible, chars_cost)
  end

  local function scope_overlap(sa, sb)
    return overlap(sa, sb, globstar, seg_overlap)
  end

  local function sets_overlap(A, B)
    for _, a in ipairs(A) do
      for _, b in ipairs(B) do
        if scope_overlap(a, b) then return true end
      end
    end
    return false
  end

  -- ------------------------------------------------------------------ the scope index
  
  local function ancestors(p)
    local out = {''}
    if p == '' then return out end
    local pos = 1
    while true do
      local s = string.find(p, '/', pos, true)
      if not s then out[#out + 1] = p; break end
      out[#out + 1] = string.sub(p, 1, s - 1)
      pos = s + 1
    end
    return out
  end
  
  local function idx_remove(sid)
    if not sid then return end
    local meta = redis.call('HGET', KEYS[8], sid)
    if meta then
      local m = cjson.decode(meta)
      for _, p in ipairs(m.pf) do redis.call('ZREM', KEYS[7], p .. '\0' .. sid) end
      redis.call('HDEL', KEYS[8], sid)
    end
    redis.call('HDEL', KEYS[9], sid)
  end
  
  local function idx_add(sid, meta_json, prefixes, expires, owner)
    for _, p in ipairs(prefixes) do redis.call('ZADD', KEYS[7], '0', p .. '\0' .. sid) end
    redis.call('HSET', KEYS[8], sid, meta_json)
    redis.call('HSET', KEYS[9], sid, I(expires) .. '\0' .. owner)
  end
  
  -- The latest expiry among other principals' effective leases (not on resource `rd`) whose
  -- scopes overlap `toks`, or nil. Candidates come from the prefix index only: a scope can
  -- overlap another only if one's literal prefix is a segment prefix of the other's, and the
  -- ranges below visit exactly the leases for which prefect_baton._rules.scopes.prefixes_meet
  -- holds (the rule by which the ledger skips the others; tests/redis/test_authority.py
  -- checks both agree). Every candidate is compared, as the ledger compares them
  -- (LeaseOps._scope_conflict), so neither the verdict (a conflict, or too costly) nor the
  -- expiry depends on the order they are met in, which differs between the stores. Entries
  -- of leases that ran out are dropped from the index on the way (they can never become
  -- effective again). The second result is true when this call's comparisons (with those
  -- of the same script call before it: every item of acquire_many) took more than
  -- SCOPE_CHECK_STEPS steps (the caller answers C_SCOPE_STEPS and writes nothing).
  local function scope_conflict(prefixes, toks, principal, rd, now)
    local seen, cands = {}, {}
    local function take(members)
      for _, m in ipairs(members) do
        local z = string.find(m, '\0', 1, true)
        local sid = string.sub(m, z + 1)
        if not seen[sid] then seen[sid] = true; cands[#cands + 1] = sid end
      end
    end
    local everything = false
    for _, p in ipairs(prefixes) do
      if p == '' then everything = true end
    end
    if everything then
      take(redis.call('ZRANGEBYLEX', KEYS[7], '-', '(' .. PAD_MEMBER))
    else
      local asked = {}
      for _, p in ipairs(prefixes) do
        for _, q in ipairs(ancestors(p)) do
          if not asked[q] then
            asked[q] = true
            take(redis.call('ZRANGEBYLEX', KEYS[7], '[' .. q .. '\0', '(' .. q .. '\1'))
          end
        end
        take(redis.call('ZRANGEBYLEX', KEYS[7], '[' .. p .. '/', '(' .. p .. '0'))
      end
    end
    local found = nil
    for _, sid in ipairs(cands) do
      local ev = redis.call('HGET', KEYS[9], sid)
      if not ev then
        idx_remove(sid)
      else
        local z = string.find(ev, '\0', 1, true)
        local exp = tonumber(string.sub(ev, 1, z - 1))
        if exp <= now then
          idx_remove(sid)
        elseif string.sub(ev, z + 1) ~= principal then
          local meta = cjson.decode(redis.call('HGET', KEYS[8], sid))
          if meta.r ~= rd then
            local ok, hit = pcall(sets_overlap, toks, meta.t)
            if not ok then
              if hit ~= OUT_OF_STEPS then error(hit) end
              return nil, true
            end
            if hit and (not found or exp > found) then found = exp end
          end
        end
      end
    end
    return found, false
  end
  -- steps(n) sets the steps left (when given) and returns them: for tests of the mirror.
  local function steps(n)
    if n then _scope_steps = n end
    return _scope_steps
  end
  _scopes_lib = {sets_overlap = sets_overlap, scope_conflict = scope_conflict,
                 idx_add = idx_add, idx_remove = idx_remove, steps = steps}
  return _scopes_lib
end

-- ------------------------------------------------------------------ writes

-- Drop generations retired longer ago than the retention (`old`, `oldx` and their `lid`
-- entries). About one call in eight (by the clock) does it, for up to 16 + 8 * `retired`
-- generations (the number this call retired): twice as many as the calls in between
-- retire on average, so `old` stays bounded under any steady load.
local function prune_old(now, mk, retired)
  if now % 8 ~= 0 then return end
  local ret = tonumber(mk.ret) or 86400000
  local ids = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', I(now - ret), 'LIMIT', 0,
    16 + 8 * retired)
  for first = 1, #ids, 256 do
    local chunk = {unpack(ids, first, math.min(first + 255, #ids))}
    redis.call('HDEL', KEYS[4], unpack(chunk))
    redis.call('HDEL', KEYS[3], unpack(chunk))
    redis.call('ZREM', KEYS[5], unpack(chunk))
  end
end

-- What the org keeps under `field` in rc (an acquire receipt, a handoff's resolution), or
-- nil: never kept, pruned, or past its expiry in rcx (not pruned yet). Nothing kept here
-- can vanish unseen: rc and rcx are checked with the other keys (intact()), and neither
-- has a TTL, so no volatile-* maxmemory-policy evicts them.
local function kept(field, now)
  local v = redis.call('HGET', KEYS[11], field)
  if not v then return nil end
  local x = redis.call('ZSCORE', KEYS[12], field)
  if x and tonumber(x) <= now then return nil end
  return v
end

-- Keep `value` under `field` in rc until now + ttl_ms (a number), and drop up to 8 fields
-- past their expiry: more than each call adds, so rc stays bounded under any steady load.
local function keep(field, value, ttl_ms, now)
  redis.call('HSET', KEYS[11], field, value)
  redis.call('ZADD', KEYS[12], I(now + ttl_ms), field)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[12], '-inf', I(now), 'LIMIT', 0, 8)
  if #gone > 0 then
    redis.call('HDEL', KEYS[11], unpack(gone))
    redis.call('ZREM', KEYS[12], unpack(gone))
  end
end

-- Move a generation that stops being its resource's head into `old`.
local function retire(g, now, json)
  redis.call('HSET', KEYS[4], g.id, json or enc(g))
  redis.call('ZADD', KEYS[5], g.ea or now, g.id)
end

local function own_member(g)
  return g.o .. '\0' .. g.rd
end

-- Append one journal entry made of `parts`: seven slots for the header (filled here), then
-- the five pieces of each of `count` items. `ho` is the handoff id and `note` its note (nil
-- when none). The entry's text is made by one concatenation of all the pieces.
local function journal_parts(mk, principal, role, now, parts, count, ho, note)
  local nt = ''
  if note then nt = '=' .. note end
  parts[1], parts[2], parts[3], parts[4], parts[5], parts[6], parts[7] =
    mk.id, principal, role, I(now), ho or '', nt, count
  return redis.call('XADD', KEYS[10], '*', 'p', table.concat(parts, '\0'))
end

-- Append one journal entry; `items` are built by item(). Generations are encoded once and
-- reused.
local function journal(mk, principal, role, now, items, ho, note)
  local parts
  if #items == 1 then
    local it = items[1]
    parts = {false, false, false, false, false, false, false, it[1], it[2], it[3], it[4], it[5]}
  else
    parts = {false, false, false, false, false, false, false}
    local n = 7
    for _, it in ipairs(items) do
      parts[n + 1], parts[n + 2], parts[n + 3], parts[n + 4], parts[n + 5] =
        it[1], it[2], it[3], it[4], it[5]
      n = n + 5
    end
  end
  return journal_parts(mk, principal, role, now, parts, #items, ho, note)
end

-- One journal item (its five pieces): the action, the new generation, the ended generation
-- (or nil) and the receipt's request digest and expires_at_ms (or nil).
local function item(action, new_s, ended_s, rc_digest, rc_ex)
  return {action, rc_digest or '', rc_ex or '', new_s, ended_s or NO_GEN}
end
