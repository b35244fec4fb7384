-- once_renew: extend a Once's run lease if the call still holds it.
-- It never moves the expiry earlier.
--
-- KEYS[1] run hash
-- ARGV[1] token of the runner's call
-- ARGV[2] lease TTL (ms)
-- Reply: 1 extended, 0 the call no longer holds the run lease.

if redis.call('HGET', KEYS[1], 't') == ARGV[1] then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
return 0
