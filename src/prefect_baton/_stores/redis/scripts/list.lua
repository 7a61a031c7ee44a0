-- list.lua: the effective leases of one owner (or of everyone), from the owner index.
-- KEYS[1..12]: the per-org keys listed in _lib.lua.
-- ARGV[1] owner ("" = every owner), ARGV[2] resource type ("" or "=" .. type).
-- Returns:
--   {0, now_ms, generation, ...}         in no particular order
--   {30}                                 no incarnation marker
if not marker() then return {C_NO_INCARNATION} end
local now = now_ms()
local members
if ARGV[1] == '' then
  members = redis.call('ZRANGEBYLEX', KEYS[6], '-', '(' .. PAD_MEMBER)
else
  members = redis.call('ZRANGEBYLEX', KEYS[6], '[' .. ARGV[1] .. '\0', '(' .. ARGV[1] .. '\1')
end
local rtype = opt(ARGV[2])
local out = {C_OK, I(now)}
for _, m in ipairs(members) do
  local z = string.find(m, '\0', 1, true)
  local raw = redis.call('HGET', KEYS[2], string.sub(m, z + 1))
  if raw then
    local g = dec(raw)
    if effective(g, now) and (not rtype or g.rt == rtype) then out[#out + 1] = raw end
  end
end
return out
