-- mutex_renew: extend Mutex holds (and RWMutex write holds, a field of the
-- writer hash too) whose owners still have them, one or many in one call.
-- It never moves an expiry earlier: the owner may also hold the lock
-- through a re-entry from another process, renewed at that process's
-- shorter TTL.
--
-- A hold is named by its owner and its fencing token: a hold that was lost
-- is not renewed in place of a later hold of the same owner (taken afresh,
-- maybe in another process, after someone else held the name in between).
--
-- KEYS[i] lock hash (or RWMutex writer hash) of hold i
-- ARGV[3i-2] owner token of hold i
-- ARGV[3i-1] lease TTL of hold i (ms)
-- ARGV[3i]   fencing token of hold i
-- A lock hash of another type (foreign data) counts as gone, for its hold
-- only (see lib.lua's peek).
-- Reply: an array with, for each hold in order, 1 extended or 0 the owner
--        no longer holds it.

local out = {}
for i = 1, #KEYS do
  local cur = peek('HMGET', KEYS[i], ARGV[3 * i - 2], ':f')
  if cur and cur[1] and cur[2] == ARGV[3 * i] then
    extend_key(KEYS[i], ARGV[3 * i - 1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
