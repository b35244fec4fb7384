-- mutex_lib: definitions shared by mutex_lock.lua and mutex_unlock.lua,
-- which begin with this file (lua.Source puts it in front).

-- Issues the next fencing token, given the fence hash's 'n' and 'e' (as
-- HMGET returns them: the last token and when the hash expires, false when
-- the hash is gone), and returns it as a string and as a number (nil
-- when 'n' is out of range): see lib.lua's fence_after and set_fence.
-- Tokens so keep rising across the hash's expiry, and track server
-- time, so that they keep rising where a counter alone would not: on a
-- promoted replica that missed the last writes, or in quorum mode on
-- masters that missed a release.
local function next_token(fence, idle)
  clock()
  local s, n = fence_after(fence[1], now_us)
  if not s then
    return nil
  end
  set_fence(KEYS[2], s, fence[2], idle)
  return s, n
end
