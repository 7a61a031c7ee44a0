-- _acquire.lua: the acquire decision and its writes, shared by acquire.lua and
-- acquire_many.lua (prepended after _lib.lua to those two scripts only).

-- Decide an acquire of one resource (a mirror of prefect_baton._rules.core.decide_acquire plus
-- the ledger's receipt check and core.replay_check). `it` holds the request (it.at: the
-- attempt token, nil for an anonymous attempt), `raw` the resource's head as stored (or
-- nil); returns a reply table on refusal, or {C_OK, plan} with
-- plan = {new, ended, head, raw, action} (or a replay/no-op reply).
-- A receipt is {"d": digest, "id": lease id, "e": epoch, "a": attempt (absent: anonymous)}.
local function decide_acquire(it, principal, key, now, mk, raw)
  if key and it.rk then
    local r = kept(it.rk, now)
    if r then
      local rec = cjson.decode(r)
      if rec.d ~= it.digest then return {C_MISMATCH, key} end
      local g = gen_by_id(rec.id)
      local held = g and g.o == principal and g.k == key and g.e == tonumber(rec.e)
        and effective(g, now)
      local same = rec.a == it.at
      if held then
        if same then return {C_REPLAY, enc(g)} end
        return {C_IN_FLIGHT, key, I(g.x)}
      end
      local why = 'gone'
      if g then why = lost_reason(g, now) end
      -- a transferred lease refuses every attempt (its work went to the recipient)
      if same or why == 'transferred' then
        return {C_LOST, 'lease ' .. rec.id .. ' acquired under this execution key is no '
          .. 'longer held (' .. why .. '); a replayed receipt does not revive it: use a new '
          .. 'execution key', why}
      end
      -- another attempt acquires afresh; apply_acquire replaces the receipt
    end
  end
  local head = peek(raw)
  local ended, action = nil, 'acquire'
  if head and effective(head, now) then
    local same = head.o == principal
    if same and key and head.k == key then return {C_NOOP, raw} end
    if same and not key and head.k == nil then
      ended = dec(raw); ended.s = 'superseded'; ended.ea = now; action = 'supersede'
    elseif same then
      return {C_CONFLICT, I(head.x), 2}
    else
      return {C_CONFLICT, I(head.x), 0}
    end
  end
  local cur = 0
  if head then cur = head.v end
  if it.ev and it.ev ~= cur then return {C_VERSION, I(cur), I(it.ev)} end
  if it.sc then
    local exp, costly = S().scope_conflict(it.pf, it.tk, principal, it.rd, now)
    if costly then return {C_SCOPE_STEPS} end
    if exp then return {C_CONFLICT, I(exp), 1} end
  end
  if head and (head.v >= MAX_SAFE or head.e >= MAX_SAFE) then return {C_INVALID, EXHAUSTED} end
  if mk.delay > now then return {C_CONFLICT, I(mk.delay), 0} end
  if head and head.s == 'active' and not ended then
    ended = dec(raw); ended.s = 'taken_over'; ended.ea = now; action = 'takeover'
  end
  local epoch = mk.floor
  if head and head.e > epoch then epoch = head.e end
  epoch = epoch + 1
  if epoch >= mk.ceil then return {C_ROTATE} end
  local new = {id = it.id, rt = it.rt, ri = it.ri, rd = it.rd, o = principal, k = key,
               v = cur + 1, e = epoch, s = 'active', a = now, x = now + it.ttl, t = it.ttl,
               sc = it.sc, p = it.p}
  if it.sc then new.sid = it.id end
  return {C_OK, {new = new, ended = ended, head = head, raw = raw, action = action}}
end

-- Apply a decided acquire; returns the journal item and the new generation (texts). The
-- writes to the heads, lease-id and owner indexes are gathered in `w` ({h = {}, l = {},
-- o = {}}) and written by flush_acquired(w), so that several acquires write each key once;
-- without `w` (one acquire) they are written at once.
local function apply_acquire(it, plan, principal, key, now, mk, w)
  local new, ended, head = plan.new, plan.ended, plan.head
  local ended_s = nil
  if ended then
    if head.sid then S().idx_remove(head.sid) end
    redis.call('ZREM', KEYS[6], own_member(head))
    ended_s = enc(ended)
    retire(ended, now, ended_s)
  elseif head then
    retire(head, now, plan.raw)
  end
  if head then prune_old(now, mk, 1) end
  local new_s = enc(new)
  if w then
    local h, l, o = w.h, w.l, w.o
    h[#h + 1] = it.rd; h[#h + 1] = new_s
    l[#l + 1] = new.id; l[#l + 1] = it.rd
    o[#o + 1] = '0'; o[#o + 1] = own_member(new)
  else
    redis.call('HSET', KEYS[2], it.rd, new_s)
    redis.call('HSET', KEYS[3], new.id, it.rd)
    redis.call('ZADD', KEYS[6], '0', own_member(new))
  end
  if new.sid then S().idx_add(new.sid, it.meta, it.pf, new.x, principal) end
  local rc_d, rc_ex = nil, nil
  if key and it.rk then
    local a = ''
    if it.at then a = ',"a":' .. cjson.encode(it.at) end
    local rttl = tonumber(it.rttl_s)
    keep(it.rk, '{"d":"' .. it.digest .. '","id":"' .. new.id .. '","e":"' .. I(new.e) .. '"'
      .. a .. '}', rttl, now)
    rc_d, rc_ex = it.digest, I(now + rttl)
    if it.at then rc_d = rc_d .. '|' .. it.at end  -- the journal's receipt carries the attempt
  end
  return item(plan.action, new_s, ended_s, rc_d, rc_ex), new_s
end

local function flush_acquired(w)
  if #w.h == 0 then return end
  redis.call('HSET', KEYS[2], unpack(w.h))
  redis.call('HSET', KEYS[3], unpack(w.l))
  redis.call('ZADD', KEYS[6], unpack(w.o))
end

-- What a call deciding several acquires does with request i's decision r: nil when r
-- grants, is a no-op or a replay (the caller keeps it); otherwise the reply to return at
-- once ({31}, or the refusal with the index: {code, i, ...}).
local function stop_at(r, i)
  local code = r[1]
  if code == C_OK or code == C_NOOP or code == C_REPLAY then return nil end
  if code == C_ROTATE then return r end
  local out = {code, i}
  for k = 2, #r do out[#out + 1] = r[k] end
  return out
end

-- Read one acquire request from ARGV starting at index `b` (12 fields; the last one is the
-- field of rc holding its receipt, "" when the acquire has no execution key).
local function read_item(b)
  local ev, sc, meta, pf, tk, rk = opt(ARGV[b + 5]), nil, nil, nil, nil, nil
  if ev then ev = tonumber(ev) end
  if ARGV[b + 8] ~= '' then
    sc, meta = ARGV[b + 8], ARGV[b + 9]
    local m = cjson.decode(meta)
    pf, tk = m.pf, m.t
  end
  if ARGV[b + 11] ~= '' then rk = ARGV[b + 11] end
  -- The receipt TTL is used as text (PX); the lease TTL's text is remembered by N().
  return {rd = ARGV[b], rt = ARGV[b + 1], ri = ARGV[b + 2], ttl = N(ARGV[b + 3]),
          p = opt(ARGV[b + 4]), ev = ev, id = ARGV[b + 6], digest = ARGV[b + 7], sc = sc,
          meta = meta, pf = pf, tk = tk, rk = rk, rttl_s = ARGV[b + 10]}
end
