-- semaphore_abandon: undo whatever an Acquire or TryAcquire call its caller
-- gave up on (ctx done, reply lost, error) may have done: its queue place,
-- or the permits it took (also when they were handed to it). The call is
-- marked abandoned, so an attempt of it that arrives later changes nothing.
-- Waiters behind a dropped place are served if they now fit. Preceded by
-- semaphore_lib.lua, which describes KEYS[1..5].
--
-- ARGV[1] holder token
-- ARGV[2] n of the call
-- ARGV[3] id of the abandoned call
-- ARGV[4] idle expiry of the fence hash (ms)
-- ARGV[5] notification channel
-- Reply: {permits the holder still holds, fencing token of its holding}
--        ({0, 0} if it holds nothing).

local tok, n, id, idle, ch = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]

prune()
if not find(redis.call('HGET', KEYS[2], 'sx'), id) then
  redis.call('HSET', KEYS[2], 'sx', push(redis.call('HGET', KEYS[2], 'sx'), id))
end
redis.call('PEXPIRE', KEYS[2], idle)
unqueue(id)

local cnt = tonumber(redis.call('HGET', KEYS[1], tok) or '0')
local f = redis.call('HGET', KEYS[1], ':f:' .. tok) or '0'
local list = redis.call('HGET', KEYS[1], ':c:' .. tok)
if cnt > 0 and find(list, id) then
  local back = math.min(n, cnt)
  if back == cnt then
    finish(tok, cnt)
  else
    redis.call('HINCRBY', KEYS[1], tok, -back)
    redis.call('HINCRBY', KEYS[1], ':used', -back)
    redis.call('HSET', KEYS[1], ':c:' .. tok, drop(list, id))
  end
  cnt = cnt - back
end
grant(ch, idle, '')
tidy()
if cnt == 0 then
  return { 0, tonumber(f) }
end
return { cnt, tonumber(f) }
