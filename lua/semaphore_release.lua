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
-- ARGV[7] the fencing token of the holding the caller releases, or '':
--         a holding with another token is not the caller's
-- Reply: {1, permits still held, fencing token} released (0 held: the
--        holding ended; a repeat of this call answers so again);
--        {0, 0, 0} the holder holds nothing; {2, permits held, fencing
--        token} n is more than it holds, nothing changed; {3, size in
--        force, 0} the size differs, nothing changed.

local tok, n, size, id, idle, ch = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]

prune()
local sr = fence_get('sr')
local ended = find(sr, id)
if ended then
  return { 1, 0, tonumber(ended) }
end

local h = hold(tok)
local cnt, f = h.n, h.f
if cnt == 0 then
  local _, head = grant(ch, idle, '')
  tidy(head)
  return { 0, 0, 0 }
end
if find(h.c, id) then
  return { 1, cnt, tonumber(f) }
end
if ARGV[7] and ARGV[7] ~= '' and f ~= ARGV[7] then
  -- A later holding of the same holder: the caller's ended unreleased.
  return { 0, 0, 0 }
end
if in_force and in_force ~= size then
  return { 3, in_force, 0 }
end
if n > cnt then
  return { 2, cnt, tonumber(f) }
end

if n == cnt then
  redis.call('HSET', KEYS[2], 'sr', push(sr, id .. ':' .. f))
  keep_fence(idle)
  local head = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
  if not head and used <= cnt then
    -- The last holding ended and nobody waits: tidy up at once.
    redis.call('DEL', KEYS[1], KEYS[3], KEYS[4], KEYS[5])
    return { 1, 0, tonumber(f) }
  end
  finish(tok, cnt)
  if head then
    local _, left = grant(ch, idle, '', head)
    head = left
  end
  tidy(head)
else
  h.n, h.c, used = cnt - n, push(h.c, id), used - n
  redis.call('HSET', KEYS[1], tok, fmt(h.n), ':c:' .. tok, h.c, ':used', fmt(used))
  local _, head = grant(ch, idle, '')
  tidy(head)
end
return { 1, cnt - n, tonumber(f) }
