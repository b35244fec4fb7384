-- semaphore_lib: definitions shared by semaphore_acquire, semaphore_release
-- and semaphore_abandon; lua/semaphore.go puts this text in front of each of
-- them. It reads no ARGV and changes nothing by itself.
--
-- The keys of one semaphore, all under its {name} hash tag:
-- KEYS[1] state hash: ':size' the size in force, ':used' permits held in all
--         (kept equal to the sum of the holdings), <token> -> permits held by
--         that holder, ':f:'<token> -> fencing token of that holding,
--         ':c:'<token> -> ids of the latest calls applied to that holding.
--         Owner tokens never begin with ':', so the fields cannot clash.
-- KEYS[2] fence hash (outlives holdings, idle expiry): 'n' last fencing token
--         (shared with the other primitives of the name), 'sr' latest
--         releases that ended a holding ("<call id>:<fence> ..."), 'sx'
--         latest abandoned Acquire call ids.
-- KEYS[3] holders zset: <token> -> lease deadline (server ms)
-- KEYS[4] queue zset: Acquire call id -> arrival (server µs, increasing)
-- KEYS[5] queue data hash: call id -> "<place deadline ms> <ttl ms> <n> <token>"
--
-- Invariants kept by every script: a holder whose deadline passed is pruned
-- before anything else is decided, so its permits come back by themselves;
-- waiters are served strictly in arrival order (the head is served when it
-- fits, nobody passes it); every key carries an expiry at least as late as
-- the deadlines stored in it.

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)

-- How many call ids a holding (and a name, for releases and abandons)
-- remembers: enough for the retries of calls in flight at once.
local RECENT = 32

-- Numbers are formatted by hand: Lua would print 1.7e+15.
local function fmt(x)
  return string.format('%.0f', x)
end

-- Lists are space-separated items "<id>" or "<id>:<value>", newest first.
local function find(list, id)
  if not list then
    return nil
  end
  for item in string.gmatch(list, '%S+') do
    local k, v = string.match(item, '^([^:]+):?(.*)$')
    if k == id then
      return v
    end
  end
  return nil
end

local function push(list, item)
  local out = { item }
  if list then
    for it in string.gmatch(list, '%S+') do
      if #out >= RECENT then
        break
      end
      out[#out + 1] = it
    end
  end
  return table.concat(out, ' ')
end

local function drop(list, id)
  local out = {}
  if list then
    for it in string.gmatch(list, '%S+') do
      if string.match(it, '^([^:]+)') ~= id then
        out[#out + 1] = it
      end
    end
  end
  return table.concat(out, ' ')
end

local function used()
  return tonumber(redis.call('HGET', KEYS[1], ':used') or '0')
end

local function extend(key, ttl)
  if redis.call('PTTL', key) < tonumber(ttl) then
    redis.call('PEXPIRE', key, ttl)
  end
end

-- Drop the holdings whose lease ran out, giving their permits back.
local function prune()
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms, 'LIMIT', 0, 100)
  for _, h in ipairs(gone) do
    local c = tonumber(redis.call('HGET', KEYS[1], h) or '0')
    redis.call('HDEL', KEYS[1], h, ':f:' .. h, ':c:' .. h)
    redis.call('ZREM', KEYS[3], h)
    if c > 0 then
      redis.call('HINCRBY', KEYS[1], ':used', -c)
    end
  end
end

-- Next fencing token = max(last + 1, server time in µs), so tokens keep
-- rising even after the fence hash expired.
local function fence(idle)
  local f = redis.call('HINCRBY', KEYS[2], 'n', 1)
  if f < now_us then
    redis.call('HSET', KEYS[2], 'n', fmt(now_us))
    f = now_us
  end
  redis.call('PEXPIRE', KEYS[2], idle)
  return fmt(f)
end

-- Give n permits to tok for the call id: a fresh holding gets a new fencing
-- token, a holder that holds already adds to its count and keeps its token.
-- The lease deadline never moves back (another process of the same owner
-- may have a longer TTL). Returns the fencing token (a string).
local function take(tok, n, ttl, id, idle)
  local f
  if redis.call('HEXISTS', KEYS[1], tok) == 1 then
    redis.call('HINCRBY', KEYS[1], tok, n)
    f = redis.call('HGET', KEYS[1], ':f:' .. tok)
  else
    f = fence(idle)
    redis.call('HSET', KEYS[1], tok, n, ':f:' .. tok, f)
  end
  redis.call('HINCRBY', KEYS[1], ':used', n)
  redis.call('HSET', KEYS[1], ':c:' .. tok, push(redis.call('HGET', KEYS[1], ':c:' .. tok), id))
  local d = now_ms + tonumber(ttl)
  local cur = redis.call('ZSCORE', KEYS[3], tok)
  if not cur or tonumber(cur) < d then
    redis.call('ZADD', KEYS[3], fmt(d), tok)
  end
  extend(KEYS[1], ttl)
  extend(KEYS[3], ttl)
  return f
end

-- End tok's holding of c permits.
local function finish(tok, c)
  redis.call('HDEL', KEYS[1], tok, ':f:' .. tok, ':c:' .. tok)
  redis.call('ZREM', KEYS[3], tok)
  redis.call('HINCRBY', KEYS[1], ':used', -c)
end

local function unqueue(id)
  redis.call('ZREM', KEYS[4], id)
  redis.call('HDEL', KEYS[5], id)
end

-- Serve the queue in arrival order: hand permits to the head while it fits,
-- dropping heads whose place lapsed, and tell each served waiter on the
-- channel ("<call id> <fence>"): it holds them now, without another round
-- trip. Stops at the first live head that does not fit, so a large request
-- is never passed by smaller ones. Returns the fencing token if the waiter
-- with call id self was served (it learns from the reply instead).
local function grant(ch, idle, self)
  local size = tonumber(redis.call('HGET', KEYS[1], ':size') or '0')
  local served
  for _ = 1, 100 do
    local h = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
    if not h then
      break
    end
    local d = redis.call('HGET', KEYS[5], h)
    local dl, ttl, n, tok
    if d then
      dl, ttl, n, tok = string.match(d, '^(%d+) (%d+) (%d+) (.+)$')
    end
    if not dl or tonumber(dl) <= now_ms then
      unqueue(h)
    elseif used() + tonumber(n) > size then
      break
    else
      unqueue(h)
      local f = take(tok, n, ttl, h, idle)
      if h == self then
        served = f
      else
        redis.call('PUBLISH', ch, h .. ' ' .. f)
      end
    end
  end
  return served
end

-- Delete the semaphore's keys when nothing is held or queued, so that a new
-- size may take over and nothing is left behind. The fence hash stays.
local function tidy()
  if used() <= 0 and redis.call('ZCARD', KEYS[4]) == 0 then
    redis.call('DEL', KEYS[1], KEYS[3], KEYS[4], KEYS[5])
  end
end

-- How long a waiter may sleep before trying again: until the first lease
-- or the place of the head before it can lapse, at most cap ms.
local function waitms(self, cap)
  local w = tonumber(cap)
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if first[2] then
    w = math.min(w, tonumber(first[2]) - now_ms)
  end
  local h = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
  if h and h ~= self then
    local d = redis.call('HGET', KEYS[5], h)
    if d then
      w = math.min(w, tonumber(string.match(d, '^(%d+)')) - now_ms)
    end
  end
  return math.max(w, 1)
end

