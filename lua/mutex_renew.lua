-- mutex_renew: extend Mutex holds (and RWMutex write holds, a field of the
-- writer hash too) whose owners still have them, one or many in one call.
-- It never moves an expiry earlier: the owner may also hold the lock
-- through a re-entry from another process, renewed at that process's
-- shorter TTL.
--
-- KEYS[i] lock hash (or RWMutex writer hash) of hold i
-- ARGV[2i-1] owner token of hold i
-- ARGV[2i]   lease TTL of hold i (ms)
-- Reply: an array with, for each hold in order, 1 extended or 0 the owner
--        no longer holds it.

local out = {}
for i = 1, #KEYS do
  if redis.call('HEXISTS', KEYS[i], ARGV[2 * i - 1]) == 1 then
    extend_key(KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
