-- rwmutex_rrenew: extend the shares of RWMutex readers that still have
-- them, one or many in one call. Other readers' leases are left alone.
--
-- KEYS[2i-1] readers zset of hold i: reader token -> lease deadline (server
--            ms); KEYS[2i] its readers hash (see rwmutex_lock.lua)
-- ARGV[3i-2] owner token of hold i
-- ARGV[3i-1] lease TTL of hold i (ms)
-- ARGV[3i]   hold id of hold i: a read hold that ended is not renewed in
--            place of a later one of the same owner
-- A key of another type (foreign data) counts as gone, for its hold only
-- (see lib.lua's peek).
-- Reply: an array with, for each hold in order, 1 extended or 0 gone
--        (released, or its lease ran out).

clock()
local out = {}
for i = 1, #KEYS / 2 do
  local z, h = KEYS[2 * i - 1], KEYS[2 * i]
  local tok, ttl = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1])
  local s = peek('ZSCORE', z, tok)
  if not s or tonumber(s) <= now_ms then
    if s then
      -- Expired: its share is gone even if no script pruned it yet.
      redis.call('ZREM', z, tok)
      -- h may hold another type (foreign data): its error would fail
      -- every hold of the call.
      redis.pcall('HDEL', h, tok)
    end
    out[i] = 0
  elseif string.match(peek('HGET', h, tok) or '', '^%S+ (%S+)') ~= ARGV[3 * i] then
    -- The owner reads through a later hold (record "<count> <hold id>
    -- <call ids>"): this one ended.
    out[i] = 0
  else
    if now_ms + ttl > tonumber(s) then
      redis.call('ZADD', z, digits(now_ms + ttl), tok)
    end
    if redis.call('PTTL', z) < ttl then
      redis.call('PEXPIRE', z, ttl)
      redis.call('PEXPIRE', h, ttl)
    end
    out[i] = 1
  end
end
return out
