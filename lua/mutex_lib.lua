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

-- Server time, read once and only where it is needed (a queue, a token).
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
-- token, or false when the hash is gone), and returns it as a string (nil
-- when 'n' is out of range): see lib.lua's fence_after. Tokens so keep
-- rising across the hash's expiry, and track server time, so that they
-- keep rising where a counter alone would not: on a promoted replica that
-- missed the last writes, or in quorum mode on masters that missed a
-- release.
local function next_token(n, idle)
  clock()
  local s = fence_after(n, now_us)
  if not s then
    return nil
  end
  redis.call('HSET', KEYS[2], 'n', s)
  keep_fence(idle)
  return s
end
