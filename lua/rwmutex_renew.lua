-- rwmutex_renew: extend an RWMutex write hold if the owner still has it.
--
-- KEYS[1] writer hash
-- ARGV[1] owner token
-- ARGV[2] lease TTL (ms)
-- Reply: 1 extended, 0 the owner no longer holds it.

if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
