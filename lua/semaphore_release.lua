-- semaphore_release: give back n permits of a holder; permits freed go to
-- the queue head(s) that fit, in arrival order. Preceded by
-- semaphore_lib.lua, which describes KEYS[1..5].
--
-- ARGV[1] holder token
-- ARGV[2] n ≥ 1
-- ARGV[3] size
-- ARGV[4] call id of this release
-- ARGV[5] idle expiry of the fence hash (ms)
-- ARGV[6] notification channel
-- Reply: {1, permits still held, fencing token} released (0 held: the
--        holding ended; a repeat of this call answers so again);
--        {0, 0, 0} the holder holds nothing; {2, permits held, fencing
--        token} n is more than it holds, nothing changed; {3, size in
--        force, 0} the size differs, nothing changed.

local tok, n, size, id, idle, ch = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]

prune()
local ended = find(redis.call('HGET', KEYS[2], 'sr'), id)
if ended then
  return { 1, 0, tonumber(ended) }
end

local cnt = tonumber(redis.call('HGET', KEYS[1], tok) or '0')
if cnt == 0 then
  grant(ch, idle, '')
  tidy()
  return { 0, 0, 0 }
end
local f = redis.call('HGET', KEYS[1], ':f:' .. tok)
if find(redis.call('HGET', KEYS[1], ':c:' .. tok), id) then
  return { 1, cnt, tonumber(f) }
end
local cur = redis.call('HGET', KEYS[1], ':size')
if cur and tonumber(cur) ~= size then
  return { 3, tonumber(cur), 0 }
end
if n > cnt then
  return { 2, cnt, tonumber(f) }
end

if n == cnt then
  finish(tok, cnt)
  redis.call('HSET', KEYS[2], 'sr', push(redis.call('HGET', KEYS[2], 'sr'), id .. ':' .. f))
  redis.call('PEXPIRE', KEYS[2], idle)
else
  redis.call('HINCRBY', KEYS[1], tok, -n)
  redis.call('HINCRBY', KEYS[1], ':used', -n)
  redis.call('HSET', KEYS[1], ':c:' .. tok, push(redis.call('HGET', KEYS[1], ':c:' .. tok), id))
end
grant(ch, idle, '')
tidy()
return { 1, cnt - n, tonumber(f) }
