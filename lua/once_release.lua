-- once_release: end a run of a Once. When f succeeded, releasing the run
-- lease and setting the done mark (with the value) happen together, so no
-- caller ever sees the Once neither done nor running between the two.
--
-- KEYS[1], KEYS[2], KEYS[3] as in once_do.lua (run hash, done hash, call
--         ids)
-- ARGV[1] token of the call
-- ARGV[2] 'done': f returned nil; store ARGV[3] as the done mark.
--         'fail': f failed or panicked; release the lease only.
--         'abandon': the call ended (ctx done, reply lost) not knowing
--         whether it holds the lease: release it if held, and remember the
--         call as abandoned so that a late attempt of it takes nothing.
-- ARGV[3] the value ('done' only)
-- ARGV[4] ms after which the done mark expires; '0' never
-- ARGV[5] notification channel
-- ARGV[6] ('done' only) the release's bound (server ms; see lib.lua's
--         stale): a 'done' may set the done mark for a run whose lease
--         expired with nobody taking over, so a copy of it that arrives
--         past its bound, when its id may be forgotten and the Once reset
--         or its mark expired, must change nothing
-- Reply: 1 released (for 'done': the done mark is set; also a copy of a
--        'fail' that released it, or of a 'done' that set the mark, gone
--        since or not), 0 the call did not hold the run lease, or this is
--        a late copy of a 'done' already applied that did not set the mark
--        (nothing changed but the call ids); for 'done', {4,
--        value} the call did not hold the run lease and another call has
--        made the Once done since, with that value (nothing changed but
--        the call ids; also a late copy of such a 'done' while that
--        call's mark is there); {6, server time ms} a 'done' past its bound
--        (ARGV[6]), nothing changed.

local tok, mode, ch = ARGV[1], ARGV[2], ARGV[5]

local function mark_done()
  redis.call('HSET', KEYS[2], 'v', ARGV[3], 't', tok)
  if ARGV[4] ~= '0' then
    redis.call('PEXPIRE', KEYS[2], ARGV[4])
  else
    -- The done mark is the user's data: it persists.
    redis.call('PERSIST', KEYS[2])
  end
end

-- A repeat of a 'done' that was applied answers as before.
if mode == 'done' and redis.call('HGET', KEYS[2], 't') == tok then
  return 1
end

-- A repeat of an end that was applied (a go-redis retry whose first copy
-- arrives late, or the caller's own retry after a lost reply) changes
-- nothing: after a Reset, a late 'done' would mark the Once done again,
-- and a late 'fail' would find another run. Its answer is the first one's
-- as far as it can still be told: 'fail' held (1) if it was remembered as
-- ENDED, which only a 'fail' that held the run is (one that did not is
-- remembered as ABANDONED, and its repeat finds the run not its own
-- again); 'done' set the done mark (1) if its mark is still there
-- (answered above) or, gone since (a Reset, the end of the period), if
-- it was remembered as having set it (DONE_BY, below); 'done' found the
-- Once done by another call ({4, value}) if it was remembered so, tagged
-- with that call's token, and that call's mark is still there (a mark
-- set since by another run has another token).
local DONE_BY = tagged(tok, 'done')
if mode ~= 'abandon' and recall(KEYS[3], tok) == ENDED then
  if mode == 'fail' or (mode == 'done' and redis.call('ZSCORE', KEYS[3], DONE_BY)) then
    return 1
  end
  if mode == 'done' then
    local d = redis.call('HMGET', KEYS[2], 'v', 't')
    if d[1] and d[2] and redis.call('ZSCORE', KEYS[3], tagged(tok, d[2])) then
      return { 4, d[1] }
    end
  end
  return 0
end

-- Reply {6, server time ms}: a 'done' past its bound changes nothing (its
-- caller sends it again with a bound of its corrected estimate).
if mode == 'done' and ARGV[6] and stale(ARGV[6]) then
  return { 6, now_ms }
end

local t = redis.call('HGET', KEYS[1], 't')

-- A 'done' whose lease was lost: v, the value of the call that has made
-- the Once done since, if any, and by, that call's token. marks: this
-- 'done' sets the done mark (it holds the run, or its lease was lost and
-- nobody runs f or has made the Once done since: f's success still
-- counts, it ran once).
local v, by, marks = false, false, false
if mode == 'done' then
  if t == tok then
    marks = true
  else
    local d = redis.call('HMGET', KEYS[2], 'v', 't')
    v, by = d[1], d[2]
    marks = not v and not t and redis.call('EXISTS', KEYS[2]) == 0
  end
end

-- The call is over: a late copy of its attempts must take nothing (see
-- once_do.lua). A run is remembered again when it ends, since it may have
-- outlasted the replay window counted from when it was taken.
if mode == 'abandon' or (mode == 'fail' and t ~= tok) then
  note(KEYS[3], tok, now(), ABANDONED)
elseif marks then
  note_all(KEYS[3], { tok, ENDED, DONE_BY, ENDED }, now())
elseif v and by then
  -- Found done by call by: a repeat answers with its value (see above).
  note_all(KEYS[3], { tok, ENDED, tagged(tok, by), ENDED }, now())
else
  note(KEYS[3], tok, now(), ENDED)
end

if t ~= tok then
  -- The lease was lost. If another call finished since, the Once is done
  -- with that call's value, which this call returns as every other
  -- caller does.
  if v then
    return { 4, v }
  end
  if marks then
    mark_done()
    -- Waiters may sleep until the expired lease's TTL: wake them.
    redis.call('PUBLISH', ch, '')
    return 1
  end
  if mode == 'fail' and not t then
    -- f failed and nobody runs it: the same, so that one of them runs f.
    redis.call('PUBLISH', ch, '')
  end
  return 0
end

local waited = redis.call('HEXISTS', KEYS[1], 'w') == 1
-- Emptied of its runner, the hash disappears.
redis.call('HDEL', KEYS[1], 't', 'w')
if mode == 'done' then
  mark_done()
end
if waited then
  redis.call('PUBLISH', ch, '')
end
return 1
