-- once_do: report a Once's done mark, or take its run lease, or say how long
-- to wait. A caller that arrives after the Once is done learns it (and the
-- value) in this one round trip.
--
-- KEYS[1] run hash, alive while someone runs f (expires with its lease):
--         't' token of the runner's call, 'w' set once someone waits
-- KEYS[2] done hash, the done mark (persists, or expires after the period):
--         'v' the value stored by the run that succeeded, 't' its call token
-- KEYS[3] call ids zset (see lib.lua and once_lib.lua): the calls that are
--         over, remembered for the replay window
-- ARGV[1] token of this call, also its id (every attempt of one call sends
--         the same)
-- ARGV[2] lease TTL (ms)
-- ARGV[3] '1' when an earlier attempt of this call was refused
-- ARGV[4] the attempt's bound (server ms; see lib.lua's stale)
-- Reply: {4, value} the Once is done;
--        {1, 0} this attempt took the run lease: the caller must run f;
--        {2, 0} the run lease was this call's already (a repeat of the
--        attempt that took it, after a lost reply);
--        {0, ms} another call runs f: wait at most ms before trying again;
--        {3, 0} the run hash holds data dsync did not write (a run
--        without an expiry);
--        {5, 0} the call is over (it took the run, which has ended since,
--        or was abandoned, or found the Once done): a late copy of one of
--        its attempts, which takes nothing;
--        {6, server time ms} this copy arrived after its bound, or its
--        bound is too far ahead: it takes nothing (see lib.lua's stale).

local tok, ttl = ARGV[1], ARGV[2]

local v = redis.call('HGET', KEYS[2], 'v')
if v then
  -- A call that waited sent attempts that changed nothing worth
  -- remembering; a late copy of one of them may still arrive, after a
  -- Reset or the end of the period. Remember that the call is over. (The
  -- common case, a call that finds the Once done at once, writes nothing.)
  if ARGV[3] == '1' and not recall(KEYS[3], tok) then
    note(KEYS[3], tok, now(), WAITED)
  end
  return { 4, v }
end

-- Checked only here, before the first write that matters: a Do on a
-- done Once reads no clock.
if stale(ARGV[4]) then
  return { 6, now_ms }
end

local t = redis.call('HGET', KEYS[1], 't')
if t == tok then
  -- A repeat of the attempt that took the run (a retry after a lost reply).
  return { 2, 0 }
end

-- A copy of an attempt of a call that is over arrives late: the run it
-- took has ended (or it never ran), and no one would renew or end a run
-- taken now.
if recall(KEYS[3], tok) then
  return { 5, 0 }
end

if t then
  local p = redis.call('PTTL', KEYS[1])
  if p == -1 then
    -- No expiry: not a run dsync wrote (a PERSIST, a restore). Say so, and
    -- write nothing: the name works again once the key is removed.
    return { 3, 0 }
  end
  redis.call('HSET', KEYS[1], 'w', '1')
  return { 0, math.max(p, 1) }
end

redis.call('HSET', KEYS[1], 't', tok)
redis.call('PEXPIRE', KEYS[1], ttl)
note(KEYS[3], tok, now(), RAN)
return { 1, 0 }
