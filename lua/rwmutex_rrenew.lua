-- rwmutex_rrenew: extend one reader's share of an RWMutex if it still has
-- it. Other readers' leases are left alone.
--
-- KEYS[1] readers zset: reader token -> lease deadline (server ms)
-- KEYS[2] readers hash: reader token -> "<reentry count> <hold id> <ids of the
--         last calls applied>" (see rwmutex_lock.lua)
-- ARGV[1] owner token
-- ARGV[2] lease TTL (ms)
-- Reply: 1 extended, 0 the reader no longer holds it (released, or its
--        lease ran out).

local tok, ttl = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
local s = redis.call('ZSCORE', KEYS[1], tok)
if not s or tonumber(s) <= now then
  if s then
    -- Expired: its share is gone even if no script pruned it yet.
    redis.call('ZREM', KEYS[1], tok)
    redis.call('HDEL', KEYS[2], tok)
  end
  return 0
end
if now + ttl > tonumber(s) then
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), tok)
end
-- Both keys live as long as the furthest lease.
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return 1
