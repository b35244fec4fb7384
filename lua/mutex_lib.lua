-- mutex_lib: definitions shared by mutex_lock.lua and mutex_unlock.lua,
-- which begin with this file (lua.Source puts it in front).

-- Call ids. A field holds the ids of the last few calls, space-separated,
-- so that a go-redis retry that arrives after other calls of the same owner
-- is still recognised as a repeat.
local function seen(list, id)
  return list ~= nil and list ~= false and string.find(' ' .. list .. ' ', ' ' .. id .. ' ', 1, true) ~= nil
end
local function remember(list, id)
  if not list or list == '' then
    return id
  end
  local l = list .. ' ' .. id
  local _, n = string.gsub(l, ' ', ' ')
  if n >= 16 then
    l = string.sub(l, string.find(l, ' ', 1, true) + 1)
  end
  return l
end

-- Server time, read only where it is needed (a queue, or a first token).
local now_us, now_ms
local function clock()
  if not now_us then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = math.floor(now_us / 1000)
  end
end

-- Keeps the fence hash (KEYS[2]) alive for idle ms after its last use. It
-- is refreshed once less than half of that is left, so that most calls
-- need not write its expiry.
local function keep_fence(idle)
  if redis.call('PTTL', KEYS[2]) < tonumber(idle) / 2 then
    redis.call('PEXPIRE', KEYS[2], idle)
  end
end

-- Issues the next fencing token, given the fence hash's 'n' (the last
-- token, or false when the hash is gone), and returns it as a string. The
-- next token is the last + 1; with no last one, the server time in µs.
-- Tokens keep rising across the hash's expiry: the hash outlives idle/2
-- without a new token, and the counter never runs ahead of server time,
-- since issuing a token takes a script run of more than a µs, and each
-- hold runs at least one script more to end.
local function next_token(n, idle)
  local f = tonumber(n)
  if f then
    f = f + 1
  else
    clock()
    f = now_us
  end
  local s = string.format('%.0f', f)
  redis.call('HSET', KEYS[2], 'n', s)
  keep_fence(idle)
  return s
end
