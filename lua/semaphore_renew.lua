-- semaphore_renew: extend the leases of Semaphore holders that still hold
-- permits, one or many in one call.
--
-- KEYS[2i-1] state hash of holding i, KEYS[2i] its holders zset (see
--            semaphore_lib.lua)
-- ARGV[3i-2] holder token of holding i
-- ARGV[3i-1] lease TTL of holding i (ms)
-- ARGV[3i]   fencing token of holding i: a holding that ended is not
--            renewed in place of a later one of the same holder
-- A key of another type (foreign data) counts as gone, for its holding
-- only (see lib.lua's peek).
-- Reply: an array with, for each holding in order, 1 extended or 0 gone
--        (its lease ran out, or its keys are gone).

clock()
local out = {}
for i = 1, #KEYS / 2 do
  local st, hz = KEYS[2 * i - 1], KEYS[2 * i]
  local tok, ttl = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1])
  local cur = peek('ZSCORE', hz, tok)
  if not cur or tonumber(cur) <= now_ms or peek('HGET', st, ':f:' .. tok) ~= ARGV[3 * i] then
    out[i] = 0
  else
    local d = now_ms + ttl
    if tonumber(cur) < d then
      redis.call('ZADD', hz, digits(d), tok)
    end
    extend_key(st, ttl)
    extend_key(hz, ttl)
    out[i] = 1
  end
end
return out
