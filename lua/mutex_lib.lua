-- mutex_lib: definitions shared by mutex_lock.lua and mutex_unlock.lua,
-- which begin with this file (lua.Source puts it in front).

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
