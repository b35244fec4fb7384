-- semaphore_acquire: take n permits of a Semaphore for a holder, or queue
-- the call (Acquire) or give up (TryAcquire). Preceded by semaphore_lib.lua,
-- which describes KEYS[1..5].
--
-- ARGV[1] holder token (owner token, or the handle's token)
-- ARGV[2] n, 1 ≤ n ≤ size
-- ARGV[3] size
-- ARGV[4] lease TTL (ms); also how long a queue place lasts unrefreshed
-- ARGV[5] call id (the same for every attempt of one Acquire call)
-- ARGV[6] '1' to take a place in the queue when not served (Acquire),
--         '0' to change nothing then (TryAcquire); '3' and '2' the same
--         for a lease that is not to be extended (FixedLease, MaxHold):
--         permits added to a holding leave its deadline where it was
-- ARGV[7] idle expiry of the fence hash (ms)
-- ARGV[8] notification channel
-- ARGV[9] the call's secret, proof of a hand-over to it (see lib.lua)
-- ARGV[10] the attempt's bound (server ms; see lib.lua's stale)
-- Reply: {1, fencing token} the holder took the permits now; {2, fencing
--        token} they were handed to this call while it waited (or a repeat
--        of this call, which changes nothing); with ARGV[6] '2' or '3',
--        both with a third element, the ms the holding has left (see
--        lib.lua's granted_left); {0, ms, server time µs} not
--        served, try again within ms (see lib.lua's refusal; queued if
--        ARGV[6] is '1' or '3'; also a late copy of an abandoned call, which
--        changes nothing); {5, 0} the call took
--        effect and its holding has ended: it takes nothing any more;
--        {4, size in force} the size differs, nothing changed;
--        {3, 0} the keys hold data dsync did not write where the fencing
--        token comes from.

-- Reply {6, server time ms}: this copy arrived after its bound, or its
-- bound is too far ahead; it takes nothing (see lib.lua's stale).
if stale(ARGV[10]) then
  return { 6, now_ms }
end

local tok, n, size, ttl, id = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local queue, idle, ch = ARGV[6] == '1' or ARGV[6] == '3', ARGV[7], ARGV[8]
local fixed = ARGV[6] == '2' or ARGV[6] == '3'

-- The reply {1, fencing token f} of permits this call took now; with
-- fixed, with how long the holding has left (a join leaves its deadline
-- as it was: see lib.lua's granted_left).
local function granted(f)
  if fixed then
    return granted_left(1, tonumber(f), hold(tok).dl - now_ms)
  end
  return { 1, tonumber(f) }
end

-- A repeat of a call that took effect (a retry after a lost reply, or an
-- attempt after the permits were handed to it), or of one abandoned or
-- refused for good, changes nothing: it answers with the holding it finds.
local done = recall(KEYS[6], id)
if done then
  if done == 1 then
    prune()
    local h = hold(tok)
    if h.n > 0 and applied(KEYS[6], h.c, id, h.f) then
      if fixed then
        return granted_left(2, tonumber(h.f), (tonumber(redis.call('ZSCORE', KEYS[3], tok)) or 0) - now_ms)
      end
      return { 2, tonumber(h.f) }
    end
    -- The holding it took effect on ended: the call is over (a late copy,
    -- or a live call that learns only now of permits handed to it). The
    -- holder may hold afresh by then, without the call's permits.
    return { 5, 0 }
  end
  return refusal(1)
end

-- The state hash first: with no permits counted (':used' 0, none for
-- this holder), no lease that ran out has permits to give back, and
-- prune waits until the call does not fit or must queue, if it comes to
-- that.
local mine = hold(tok).n
if mine > 0 or used > 0 then
  prune()
end
-- Earlier waiters first, this call among them if it was queued. With no
-- state of dsync's in the state hash (no ':size' or ':used'), one look
-- tells whether any of the semaphore's keys is there: none is, the
-- common case of a free name, and nobody waits (nor is there anything
-- for tidy to delete).
local served, head, hd
if hashed or mine > 0 or not all_absent() then
  served, head, hd = grant(ch, idle, id)
  if served then
    return out(granted(served))
  elseif served == false then
    -- Waiters served before this call are remembered.
    return out({ 3, 0 })
  end
end

tidy(head)
if in_force and in_force ~= size then
  noted(id, 2)
  return out({ 4, in_force })
end

-- Permits are counted, yet no holder has a lease deadline: the holders
-- zset was deleted or replaced (foreign data), so prune could never give
-- them back, and every waiter would keep the state hash alive. Forget
-- them, as if their leases had ended. (Read only when the call does not
-- fit: off the uncontended path.)
-- The holders zset also expires with the last lease, before the state hash
-- when a waiter's place keeps that alive longer: the permits of holders
-- whose leases all ended are then counted still. The waiters first in line
-- are served again once they are forgotten, or they (this call among them)
-- would be refused with nothing held, and sleep for a whole TTL.
if used > 0 and (head or used + n > size) and redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('DEL', KEYS[1])
  known[KEYS[1]] = -2
  used, held, hashed, queued = 0, {}, nil, nil
  if in_force then
    -- The size in force stays (the queue was made under it), and so
    -- does the mark that someone is queued.
    if head then
      redis.call('HSET', KEYS[1], ':size', fmt(in_force), ':q', '1')
      queued = true
    else
      redis.call('HSET', KEYS[1], ':size', fmt(in_force))
    end
    extend(KEYS[1], ttl)
    hashed = true
  end
  if head then
    served, head, hd = grant(ch, idle, id)
    if served then
      return out(granted(served))
    elseif served == false then
      return out({ 3, 0 })
    end
  end
end

-- Fits and nobody waits: take the permits. (If anyone waits, the head did
-- not fit, or grant would have served it: this call queues behind it.)
if not head and used + n <= size then
  local f = take(tok, n, ttl, id, idle, ARGV[3], fixed)
  if not f then
    -- Foreign data where the fencing token comes from.
    return out({ 3, 0 })
  end
  return out(granted(f))
end

prune()
if not queue then
  -- A try is done: a late copy of it must not take permits.
  noted(id, 2)
  return out(refusal(0))
end

-- Take (or refresh) a place: it lasts one TTL (200 ms at least, see
-- place_ms) and every attempt renews it, so a dead waiter's place lapses
-- alone. Arrival scores strictly increase (see lib.lua's arrive).
-- The state hash says that someone is queued (':q'), so that a release
-- need not look at the queue while nobody is. (':size' is ARGV[3] when
-- set: a size that differs was refused above.)
if not in_force or not queued then
  redis.call('HSET', KEYS[1], ':size', ARGV[3], ':q', '1')
  in_force, queued = size, true
end
arrive(KEYS[4], id)
local place = place_ms(ttl)
-- A fixed lease's TTL is written with an 'f' in front: a hand-over to
-- the call leaves a holding it joins as it was.
redis.call('HSET', KEYS[5], id, string.format('%s %s%s %d %s %s', digits(now_ms + tonumber(place)), fixed and 'f' or '', ttl, n, ARGV[9], tok))
-- The holders zset must outlive the state hash: prune reads the deadlines
-- there, and permits counted in the hash without one would never return.
for i = 3, 5 do
  extend(KEYS[i], place)
end
extend(KEYS[1], place)
return out(refusal(waitms(id, ttl, head, hd)))
