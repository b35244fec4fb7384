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
noted(id, 2)
unqueue(id)

local h = hold(tok)
local cnt, f, list = h.n, h.f or '0', h.c
-- The call took its permits into this holding if its id is in the
-- holding's list, or was dropped from it (more calls of the holder came
-- after it: see take) and has not been undone since (an undo marks it
-- abandoned).
if cnt > 0 and (seen(list, id) or (recall(KEYS[6], id) == 1 and redis.call('ZSCORE', KEYS[6], tagged(id, f)))) then
  -- Undone once: the id leaves the list.
  local back = math.min(n, cnt)
  if back == cnt then
    finish(tok, cnt)
  else
    h.n, h.c, used = cnt - back, forget(list, id), used - back
    redis.call('HSET', KEYS[1], tok, fmt(h.n), ':c:' .. tok, h.c, ':used', fmt(used))
  end
  cnt = cnt - back
end
local _, head = grant(ch, idle, '')
tidy(head)
if cnt == 0 then
  return out({ 0, tonumber(f) })
end
return out({ cnt, tonumber(f) })
