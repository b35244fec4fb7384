-- mutex_lock: take or re-enter a Mutex, or report how long to wait.
--
-- KEYS[1] lock hash: <holder token> -> reentry count, ':f' fencing token of
--         the hold, ':c' ids of the last calls applied to the hold (so an
--         abandoned call undoes only its own effect), ':w' set once someone
--         waits, ':p' the call ids' prune marker as the hold's first call
--         left it, ':d' set once an Unlock lowered the count, ':k' the
--         number of passes in a row that gave the hold (see
--         mutex_unlock.lua)
-- KEYS[2] fence hash (outlives holds, idle expiry): 'n' last fencing token,
--         'e' when the hash expires (see lib.lua's set_fence)
-- KEYS[3] queue zset: waiter token -> arrival time (µs; see lib.lua's
--         arrive)
-- KEYS[4] queue data hash: waiter token -> "<place deadline ms> <ttl ms>
--         <call id> <secret>"
-- KEYS[5] call ids zset (see lib.lua): 1 took or re-entered, 2 abandoned
--         or refused for good (a try)
-- ARGV[1] holder token
-- ARGV[2] lease TTL (ms)
-- ARGV[3] call id (the same for every attempt of one Lock call)
-- ARGV[4] '1' when the caller waits (Lock): refused, it takes (or keeps) a
--         place in the queue; '2' when it waits without one (a Lock in
--         quorum mode): refused, it has the release notify the waiters;
--         '0' (TryLock) never queues and leaves no trace in the hold
-- ARGV[5] idle expiry of the fence hash (ms)
-- ARGV[6] '1' when the owner counts re-entries itself (client reentrancy):
--         a re-entry then leaves the count in Redis at 1 (its call id is
--         still added to ':c', see mutex_unlock.lua's ARGV[8]); '2' (script
--         reentrancy) or '3' (client reentrancy) with a lease not to be
--         extended past a bound (FixedLease, MaxHold): a re-entry then
--         leaves the hold's expiry as the Lock that took it or its last
--         renewal set it
-- ARGV[7] the call's secret, proof of a hand-over to it (see lib.lua)
-- ARGV[8] the attempt's bound (server ms; see lib.lua's stale)
-- Reply: {1, fencing token} the caller took or re-entered the hold now;
--        {2, fencing token} the hold was this call's already (a hand-over,
--        or a repeat of this call); with ARGV[6] '2' or '3', a
--        re-entry's and a repeat's with a third element, the ms the hold
--        has left (see lib.lua's granted_left); {0, ms, server time µs}
--        refused: try again after at most ms (see lib.lua's refusal);
--        {3, 0} the
--        name's keys hold data dsync did not write (the name recovers when
--        they expire or are removed); {5, 0} the call took effect and its
--        hold has ended: it takes nothing any more.

-- Reply {6, server time ms}: this copy arrived after its bound, or its
-- bound is too far ahead; it takes nothing (see lib.lua's stale).
if stale(ARGV[8]) then
  return { 6, now_ms }
end

local tok, ttl, id = ARGV[1], ARGV[2], ARGV[3]
-- A re-entry leaves the hold's expiry as it was: its grants say how long
-- the hold has left (see lib.lua's granted_left).
local keep = ARGV[6] == '2' or ARGV[6] == '3'
local function reply(code, f)
  if keep then
    return granted_left(code, f, redis.call('PTTL', KEYS[1]))
  end
  return { code, f }
end

local cur = redis.call('HMGET', KEYS[1], tok, ':c', ':f', ':w')

-- A repeat of a call that took effect, or of one its caller abandoned,
-- changes nothing. A call that took effect and whose hold has ended is
-- over: a late copy, or a live call that learns only now of a hold handed
-- to it, which has ended meanwhile (it starts again as a new call). The
-- holder may hold the name afresh by then: that hold is the call's only
-- if the call took effect on it.
local done = recall(KEYS[5], id)
if done then
  if done == 1 and cur[1] and cur[3] and applied(KEYS[5], cur[2], id, cur[3]) then
    return reply(2, tonumber(cur[3]))
  elseif done == 1 then
    return { 5, 0 }
  end
  return refusal(1)
end

if cur[1] then
  if not tonumber(cur[3]) then
    return { 3, 0 }
  end
  if seen(cur[2], id) then
    -- Handed over to this call.
    return { 2, tonumber(cur[3]) }
  end
  -- Re-entry: it never moves the expiry earlier, and with a fixed lease
  -- it does not move it at all (the hold lasts its TTL from the Lock that
  -- took it, as its Lease reports). With client reentrancy the count
  -- stays at 1, but the call is remembered all the same: an abandon of
  -- another call of the holder then leaves the hold to it.
  if ARGV[6] ~= '1' and ARGV[6] ~= '3' then
    redis.call('HINCRBY', KEYS[1], tok, '1')
  end
  local calls, gone = remember_dropping(cur[2], id)
  redis.call('HSET', KEYS[1], ':c', calls)
  if not keep then
    extend_key(KEYS[1], ttl)
  end
  clock()
  if gone then
    -- More calls of the holder than ':c' keeps: an abandon of one dropped
    -- from it finds it in the call ids zset (see mutex_unlock.lua). The
    -- ids go in one ZADD with this call's.
    local list = { id, 1 }
    for d in string.gmatch(gone, '%S+') do
      list[#list + 1] = tagged(d, cur[3])
      list[#list + 1] = 1
    end
    note_all(KEYS[5], list, now_ms)
  else
    note(KEYS[5], id, now_ms, 1)
  end
  return reply(1, tonumber(cur[3]))
end

-- The queue head whose place has not lapsed; lapsed places are dropped.
local function head()
  for _ = 1, 1000 do
    local h = redis.call('ZRANGE', KEYS[3], '0', '0')[1]
    if not h then
      return nil
    end
    clock()
    local d = redis.call('HGET', KEYS[4], h)
    if d then
      -- Garbage (foreign data) does not match: no deadline, dropped. So
      -- is a place too far off (see lib.lua's too_far).
      local m, t = string.match(d, '^(%d+) (%d+) %S+ %S+$')
      local dl = m and tonumber(m)
      if dl and dl > now_ms and not too_far(dl, t) then
        return h, dl
      end
    end
    redis.call('ZREM', KEYS[3], h)
    redis.call('HDEL', KEYS[4], h)
  end
  return nil
end

local function enqueue()
  -- The place lasts one lease TTL (200 ms at least, see place_ms) and is
  -- refreshed by every attempt. Each key gets its expiry right after its
  -- write: if the next key holds foreign data (another type), the error
  -- leaves no key without one.
  clock()
  local place = place_ms(ttl)
  redis.call('HSET', KEYS[4], tok, string.format('%s %s %s %s', digits(now_ms + tonumber(place)), ttl, id, ARGV[7]))
  extend_key(KEYS[4], place)
  arrive(KEYS[3], tok)
  extend_key(KEYS[3], place)
end

-- A refusal: a waiting call (Lock) tries again later under the same id; a
-- try is done, and is remembered (as abandoned) so that a late copy of it
-- cannot take the lock.
local function refused(ms)
  if ARGV[4] ~= '1' then
    clock()
    note(KEYS[5], id, now_ms, 2)
  end
  return refusal(math.max(ms, 1))
end

if cur[3] then
  -- Held by another owner.
  local p = redis.call('PTTL', KEYS[1])
  if p == -1 then
    -- No expiry: not a hold dsync wrote (a PERSIST, a restore). Say so,
    -- and write nothing: the name works again once the key is removed.
    return { 3, 0 }
  end
  if not cur[4] and ARGV[4] ~= '0' then
    -- Someone waits: the release is to notify (or hand over). A try does
    -- not wait.
    redis.call('HSET', KEYS[1], ':w', '1')
  end
  if ARGV[4] == '1' then
    enqueue()
    -- The release hands the lock to the queue's head for that waiter's
    -- TTL, which may end long before this hold would: a head that died
    -- (nobody refreshes its place) would then keep the others asleep for
    -- this hold's TTL after its own hold ended. Come back by the time the
    -- head's place lapses, so that a dead waiter delays the others by its
    -- own TTL at most.
    local h, dl = head()
    if h and h ~= tok then
      p = math.min(p, dl - now_ms)
    end
  end
  return refused(p)
end

local h, dl = head()
if h and h ~= tok then
  -- Free, but a waiter is first in line: queue behind it and wait until it
  -- takes the lock or its place lapses.
  if ARGV[4] == '1' then
    enqueue()
  end
  return refused(dl - now_ms)
end
if h then
  redis.call('ZREM', KEYS[3], tok)
  redis.call('HDEL', KEYS[4], tok)
end

-- Fresh acquisition.
local f, fn = next_token(redis.call('HMGET', KEYS[2], 'n', 'e'), ARGV[5])
if not f then
  return { 3, 0 }
end
note(KEYS[5], id, now_ms, 1)
-- The hold keeps the prune marker that note left, for its Unlock.
if h then
  -- Others may still be queued behind: make the release notify them.
  redis.call('HSET', KEYS[1], tok, '1', ':f', f, ':c', id, ':p', prune_mark[KEYS[5]], ':w', '1')
else
  redis.call('HSET', KEYS[1], tok, '1', ':f', f, ':c', id, ':p', prune_mark[KEYS[5]])
end
redis.call('PEXPIRE', KEYS[1], ttl)
return { 1, fn }
