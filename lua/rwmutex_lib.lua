-- rwmutex_lib: definitions shared by rwmutex_lock.lua and rwmutex_unlock.lua,
-- which begin with this file (lua.Source puts it in front). It names the
-- keys, reads the server clock, and drops what has expired.
--
-- KEYS[1] writer hash, KEYS[2] fence hash, KEYS[3] readers zset, KEYS[4]
-- readers hash, KEYS[5] waiting writers zset, KEYS[6] waiting readers hash,
-- KEYS[7] finished calls zset (see rwmutex_lock.lua)

local W, F, R, RC, WW, RQ, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)

-- Big numbers go to Redis as plain integers, never in Lua's %.14g form.
local function num(x)
  return string.format('%.0f', x)
end

-- Leases and places end by server time: drop every expired reader (each
-- reader's share expires alone), lapsed writer places and old call ids.
local gone = redis.call('ZRANGEBYSCORE', R, '-inf', num(now))
for _, r in ipairs(gone) do
  redis.call('HDEL', RC, r)
end
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', R, '-inf', num(now))
end
redis.call('ZREMRANGEBYSCORE', WW, '-inf', num(now))
redis.call('ZREMRANGEBYSCORE', X, '-inf', num(now))

-- A zset (and its companion hash) expires with its furthest deadline, so no
-- key outlives the leases or places it records.
local function fit(z, h)
  local top = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if top[2] then
    local d = num(math.max(tonumber(top[2]) - now, 1))
    redis.call('PEXPIRE', z, d)
    if h then
      redis.call('PEXPIRE', h, d)
    end
  elseif h then
    redis.call('DEL', h)
  end
end

-- A hold remembers the ids of the last calls applied to it, not only the
-- last one: go-redis may send a script again after a read timeout, and the
-- repeat can arrive after other calls of the same owner; a repeat of any
-- remembered call changes nothing.
local KEEP_IDS = 16

-- ids: the remembered list, or nil/false when there is none.
local function seen(ids, cid)
  if not ids then
    return false
  end
  return string.find(' ' .. ids .. ' ', ' ' .. cid .. ' ', 1, true) ~= nil
end

local function remember(ids, cid)
  if not ids or ids == '' then
    return cid
  end
  ids = ids .. ' ' .. cid
  local _, n = string.gsub(ids, ' ', ' ')
  for _ = KEEP_IDS, n do
    ids = string.sub(ids, string.find(ids, ' ', 1, true) + 1)
  end
  return ids
end

