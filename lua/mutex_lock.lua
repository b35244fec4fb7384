-- mutex_lock: take or re-enter a Mutex, or report how long to wait.
--
-- KEYS[1] lock hash: <owner token> -> reentry count, ':f' fencing token of
--         the hold, ':c' ids of the last calls applied to the hold, ':w' set
--         once someone waits
-- KEYS[2] fence hash (outlives holds, idle expiry): 'n' last fencing token,
--         'r' ids of the last unlocks that released, 'x' ids of the last
--         abandoned calls
-- KEYS[3] queue zset: waiter token -> arrival time (µs)
-- KEYS[4] queue data hash: waiter token -> "<place deadline ms> <ttl ms> <call id>"
-- ARGV[1] owner token
-- ARGV[2] lease TTL (ms)
-- ARGV[3] call id (the same for every attempt of one Lock call)
-- ARGV[4] '1' when the caller waits (Lock): refused, it takes (or keeps) a
--         place in the queue; '0' (TryLock, quorum mode) never queues
-- ARGV[5] idle expiry of the fence hash (ms)
-- ARGV[6] '1' when the owner counts re-entries itself (client reentrancy):
--         a re-entry then leaves the count in Redis at 1
-- Reply: the fencing token (> 0) when the caller holds the lock, else
--        minus the number of ms after which to try again (< 0).

local tok, ttl, id = ARGV[1], ARGV[2], ARGV[3]

-- A call its caller abandoned must not take effect when it arrives late.
local fence = redis.call('HMGET', KEYS[2], 'x', 'n')
if seen(fence[1], id) then
  return -1
end

local cur = redis.call('HMGET', KEYS[1], tok, ':c', ':f', ':w')
if cur[1] then
  -- Re-entry, or a repeat of this very call (a retry after a lost reply,
  -- or a hold handed to this waiter): a repeat changes nothing.
  if not seen(cur[2], id) and ARGV[6] ~= '1' then
    redis.call('HINCRBY', KEYS[1], tok, 1)
    redis.call('HSET', KEYS[1], ':c', remember(cur[2], id))
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return tonumber(cur[3])
end

-- The queue head whose place has not lapsed; lapsed places are dropped.
local function head()
  for _ = 1, 1000 do
    local h = redis.call('ZRANGE', KEYS[3], '0', '0')[1]
    if not h then
      return nil
    end
    clock()
    local d = redis.call('HGET', KEYS[4], h)
    if d then
      local dl = tonumber(string.match(d, '^(%d+)'))
      if dl > now_ms then
        return h, dl
      end
    end
    redis.call('ZREM', KEYS[3], h)
    redis.call('HDEL', KEYS[4], h)
  end
  return nil
end

local function enqueue()
  -- The place lasts one lease TTL and is refreshed by every attempt.
  clock()
  redis.call('ZADD', KEYS[3], 'NX', now_us, tok)
  redis.call('HSET', KEYS[4], tok, string.format('%.0f %s %s', now_ms + tonumber(ttl), ttl, id))
  for i = 3, 4 do
    if redis.call('PTTL', KEYS[i]) < tonumber(ttl) then
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
  end
end

if cur[3] then
  -- Held by another owner (every hold has a fencing token).
  if not cur[4] then
    redis.call('HSET', KEYS[1], ':w', '1')
  end
  if ARGV[4] == '1' then
    enqueue()
  end
  local p = redis.call('PTTL', KEYS[1])
  if p < 1 then
    p = 1
  end
  return -p
end

local h, dl = head()
if h and h ~= tok then
  -- Free, but a waiter is first in line: queue behind it and wait until it
  -- takes the lock or its place lapses.
  if ARGV[4] == '1' then
    enqueue()
  end
  return -math.max(dl - now_ms, 1)
end
if h then
  redis.call('ZREM', KEYS[3], tok)
  redis.call('HDEL', KEYS[4], tok)
end

-- Fresh acquisition.
local f = next_token(fence[2], ARGV[5])
if h then
  -- Others may still be queued behind: make the release notify them.
  redis.call('HSET', KEYS[1], tok, '1', ':f', f, ':c', id, ':w', '1')
else
  redis.call('HSET', KEYS[1], tok, '1', ':f', f, ':c', id)
end
redis.call('PEXPIRE', KEYS[1], ttl)
return tonumber(f)
