-- mutex_unlock: release one level of a Mutex hold; a full release hands the
-- lock straight to the first waiter in the queue, if any.
--
-- KEYS[1..5] as in mutex_lock.lua (lock hash, fence hash, queue, queue
--         data, call ids); call ids of unlocks: 1 released, 2 lowered the
--         count, 0 found nothing held (only for an unlock naming no hold)
-- ARGV[1] holder token
-- ARGV[2] call id of this unlock
-- ARGV[3] notification channel
-- ARGV[4] idle expiry of the fence hash (ms)
-- ARGV[5] '' for Unlock. For a Lock call its caller abandoned (ctx done, reply
--         lost), that call's id: the call is marked abandoned so it cannot
--         take effect later, its queue place is dropped, and the hold is
--         released only if that call was the last to take or re-enter it.
-- ARGV[6] (quorum mode only) the fencing token of the hold: this master's
--         counter is raised to it, so the next holder's token is larger even
--         where another master's clock ran ahead when it was issued
-- ARGV[7] the fencing token of the hold this Unlock ends, or '' when the
--         caller does not know it: a hold with another token is not the
--         caller's (a later hold of the same holder is never ended)
-- ARGV[8] '1' when the owner counts re-entries itself (client
--         reentrancy): an abandon (ARGV[5]) leaves the hold alone while
--         other calls that took or re-entered it are remembered in ':c',
--         since the process counts them and releases the hold itself
-- ARGV[9..12] (a pass, optional) the holder token, Lock call id and lease
--         TTL (ms) of a call of the same Client waiting for the name in the
--         process (see cohort.go), and the most passes in a row while
--         others are queued in Redis: a full release gives the lock
--         straight to that call, a fresh hold with a new fencing token,
--         unless its id is remembered (abandoned), or others are queued
--         (':w') and the hold is the end of that many passes in a row
--         (':k'). Then the release goes on as without a pass.
-- ARGV[13] (an Unlock, ARGV[5] '') the unlock's bound (server ms; see
--         lib.lua's stale): a copy that arrives past it, when its id may
--         be forgotten, changes nothing. An unlock that names no hold ends
--         a level of whatever hold of the holder it finds, and one that
--         names a hold whose count an Unlock lowered may be a copy of that
--         Unlock: either would end a level again. (An unlock naming a hold
--         no Unlock lowered is no copy of a run: it skips the check.)
-- Reply: 1 released (or handed over), 2 still held by the owner (its count
--        went down), 0 the owner does not hold it, {4, fencing token}
--        released and passed (ARGV[9..12]) with that token; {6, server
--        time ms} past its bound (ARGV[13]), nothing changed. An Unlock
--        that names no hold and releases one answers {1, fencing token}
--        with that hold's token, and so does a repeat of it: a Lock call of
--        the holder that was granted that hold, and learns of it only
--        later, so knows that the hold has ended (see reentry.go's
--        ownerFlight).

local tok, id, ch, idle, guard = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if ARGV[6] and ARGV[6] ~= '' then
  local floor = tonumber(ARGV[6])
  local fence = redis.call('HMGET', KEYS[2], 'n', 'e')
  if floor and floor > (tonumber(fence[1]) or 0) then
    set_fence(KEYS[2], ARGV[6], fence[2], idle)
  end
end

local named = ARGV[7] and ARGV[7] ~= ''
if guard == '' and not named and ARGV[13] and stale(ARGV[13]) then
  return { 6, now_ms }
end
local function read_hold()
  return redis.call('HMGET', KEYS[1], tok, ':c', ':w', ':f', ':d', ':p', ':k')
end

-- A repeat of an unlock answers as before. An Unlock that names a hold
-- that is there and whose count no Unlock lowered (':d' unset) is no
-- repeat: a run of it would have ended the hold or set ':d' (holds are
-- never given a fencing token twice). It need not look up its id, nor
-- read the prune marker: the hold keeps the one its Lock saw.
local cur, fresh
if guard == '' and named then
  cur = read_hold()
  fresh = tonumber(cur[1]) and cur[4] == ARGV[7] and not cur[5]
end
if not fresh then
  if guard == '' and named and ARGV[13] and stale(ARGV[13]) then
    return { 6, now_ms }
  end
  local done = recall(KEYS[5], id)
  if done == 1 and guard == '' and not named then
    -- As the first run of an Unlock that names no hold answered (below).
    local e = ended_by(KEYS[5], id)
    local f = tonumber(e)
    if f then
      recall_again(KEYS[5], id, done, e)
      return { 1, f }
    end
  end
  if done then
    recall_again(KEYS[5], id, done)
    return done
  end
end

local function head()
  for _ = 1, 1000 do
    local h = redis.call('ZRANGE', KEYS[3], '0', '0')[1]
    if not h then
      return nil
    end
    clock()
    local d = redis.call('HGET', KEYS[4], h)
    local dl, ttl, cid, secret
    if d then
      dl, ttl, cid, secret = string.match(d, '^(%d+) (%d+) (%S+) (%S+)$')
    end
    -- A place too far off (see lib.lua's too_far) is dropped, not handed
    -- the lock. A waiter not to be handed it keeps its place (the last
    -- result says so).
    local live = dl and tonumber(dl) > now_ms and not too_far(tonumber(dl), ttl) and not recall(KEYS[5], cid)
    if live and not hands_over(ttl) then
      return h, ttl, cid, secret, true
    end
    redis.call('ZREM', KEYS[3], h)
    redis.call('HDEL', KEYS[4], h)
    if live then
      return h, ttl, cid, secret
    end
  end
  return nil
end

local calls -- the ids in ':c', once read
if guard ~= '' then
  clock()
  local was = recall(KEYS[5], guard)
  note(KEYS[5], guard, now_ms, 2)
  local d = redis.call('HGET', KEYS[4], tok)
  if d and string.match(d, '^%d+ %d+ (%S+)') == guard then
    -- The place goes (nothing is left behind), and the holder's other
    -- waiting calls, if any, woken here, queue again at once.
    redis.call('ZREM', KEYS[3], tok)
    redis.call('HDEL', KEYS[4], tok)
    wake_holder(ch, guard, tok)
    if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[3]) == 1 then
      -- It may have been first in line for a free lock: let the rest retry.
      redis.call('PUBLISH', ch, '')
    end
  end
  -- Undo only what the abandoned call did, and only once: its id leaves
  -- the list when undone. A call dropped from the list by later calls of
  -- the holder (see mutex_lock.lua) is found in the call ids zset, tagged
  -- with the hold's fencing token, if it took effect and was not undone
  -- (an undo remembers it as abandoned).
  calls = redis.call('HGET', KEYS[1], ':c')
  if seen(calls, guard) then
    calls = forget(calls, guard)
  elseif was ~= 1 or not redis.call('ZSCORE', KEYS[5], tagged(guard, redis.call('HGET', KEYS[1], ':f') or '')) then
    return 0
  end
  if ARGV[8] == '1' and calls ~= '' and redis.call('HEXISTS', KEYS[1], tok) == 1 then
    -- Client reentrancy: other calls of the process took or re-entered
    -- the hold (the Redis count is 1 whatever their number), and the
    -- process releases it once they are done.
    redis.call('HSET', KEYS[1], ':c', calls)
    return 2
  end
end

if guard ~= '' or not cur then
  cur = read_hold()
end
local cnt = tonumber(cur[1])
if not cnt or (named and cur[4] ~= ARGV[7]) then
  if guard == '' and not named then
    -- An Unlock that names no hold is remembered, so that a late copy of
    -- it cannot end a hold taken since. One that names its hold cannot.
    clock()
    note(KEYS[5], id, now_ms, 0)
  end
  return 0
end
clock()
if fresh then
  cached_mark(KEYS[5], cur[6], now_ms)
end
if cnt > 1 then
  redis.call('HINCRBY', KEYS[1], tok, '-1')
  if guard ~= '' then
    redis.call('HSET', KEYS[1], ':c', calls)
  else
    -- From now on a copy of this Unlock must be told from a new one.
    if not cur[5] then
      redis.call('HSET', KEYS[1], ':d', '1')
    end
    note(KEYS[5], id, now_ms, 2)
  end
  return 2
end

redis.call('DEL', KEYS[1])
local ptok, pid = ARGV[9], ARGV[10]
if guard == '' and ptok and ptok ~= '' then
  -- A pass: the next hold is the waiting call's, with its own TTL and id,
  -- as a hand-over's is (':w' kept for those queued in Redis).
  local k = tonumber(cur[7]) or 0
  if (not cur[3] or k < tonumber(ARGV[12])) and not recall(KEYS[5], pid) then
    local f, fn = next_token(redis.call('HMGET', KEYS[2], 'n', 'e'), idle)
    if f then
      note_all(KEYS[5], { id, 1, pid, 1 }, now_ms)
      if cur[3] then
        redis.call('HSET', KEYS[1], ptok, '1', ':f', f, ':c', pid, ':p', prune_mark[KEYS[5]], ':k', digits(k + 1), ':w', '1')
      else
        redis.call('HSET', KEYS[1], ptok, '1', ':f', f, ':c', pid, ':p', prune_mark[KEYS[5]], ':k', digits(k + 1))
      end
      redis.call('PEXPIRE', KEYS[1], ARGV[11])
      return { 4, fn }
    end
  end
end
local released = 1
if guard == '' then
  local f = not named and tonumber(cur[4])
  if f then
    -- An Unlock that names no hold: its reply, and a repeat's, say which.
    note_all(KEYS[5], { id, 1, tagged(id, cur[4]), 1 }, now_ms)
    released = { 1, f }
  else
    note(KEYS[5], id, now_ms, 1)
  end
end
-- No one waits (':w' unset): the queue has no live place, since every
-- call that queues finds the lock held by another and sets ':w', or finds
-- it free behind a live head, whose hold then begins with ':w' set.
if not cur[3] then
  return released
end

local h, ttl, cid, secret, kept = head()
if not h then
  redis.call('PUBLISH', ch, '')
  return released
end
if kept then
  -- The head's lease is too short to be handed over (see lib.lua's
  -- hands_over): it takes the free lock with its own attempt, first in
  -- line.
  publish_retry(ch, cid, h, secret)
  return released
end

-- Hand over: the head owns the lock now, with its own TTL and its Lock
-- call's id, so that call's next attempt finds it held and changes nothing.
local f = next_token(redis.call('HMGET', KEYS[2], 'n', 'e'), idle)
if not f then
  redis.call('PUBLISH', ch, '')
  return released
end
note(KEYS[5], cid, now_ms, 1)
redis.call('HSET', KEYS[1], h, '1', ':f', f, ':c', cid, ':p', prune_mark[KEYS[5]], ':w', '1')
redis.call('PEXPIRE', KEYS[1], ttl)
publish_handover(ch, cid, h, f, secret)
return released
