-- semaphore_renew: extend a Semaphore holder's lease if it still holds.
--
-- KEYS[1] state hash, KEYS[2] holders zset (see semaphore_lib.lua)
-- ARGV[1] holder token
-- ARGV[2] lease TTL (ms)
-- Reply: 1 extended, 0 the holder no longer holds permits (its lease ran
--        out, or its keys are gone).

local t = redis.call('TIME')
local now_ms = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
local cur = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not cur or tonumber(cur) <= now_ms or redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return 0
end
local d = now_ms + tonumber(ARGV[2])
if tonumber(cur) < d then
  redis.call('ZADD', KEYS[2], string.format('%.0f', d), ARGV[1])
end
for i = 1, 2 do
  if redis.call('PTTL', KEYS[i]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
  end
end
return 1
