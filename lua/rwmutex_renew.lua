-- rwmutex_renew: extend an RWMutex write hold if the owner still has it.
-- It never moves the expiry earlier: the owner may also hold it through
-- a re-entry from another process, renewed at that process's shorter TTL.
--
-- KEYS[1] writer hash
-- ARGV[1] owner token
-- ARGV[2] lease TTL (ms)
-- Reply: 1 extended, 0 the owner no longer holds it.

if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
return 0
