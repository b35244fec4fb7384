-- rwmutex_lock: take or re-enter an RWMutex for reading or for writing, or
-- report how long to wait.
--
-- KEYS[1] writer hash: <owner token> -> reentry count, ':f' fencing token of
--         the write hold, ':c' ids of the last calls applied to it (see
--         lib.lua: what an abandon may undo), ':p' the call ids' prune
--         marker as the call that began the hold found it, ':d' set once
--         an Unlock lowered the count, ':k' the number of passes in a row
--         that gave the hold (see rwmutex_unlock.lua)
-- KEYS[2] fence hash (outlives holds, idle expiry): 'n' last fencing token,
--         'e' when the hash expires (see lib.lua's set_fence)
-- KEYS[3] readers zset: reader token -> lease deadline (server ms)
-- KEYS[4] readers hash: reader token -> "<reentry count> <hold id> <ids
--         of the last calls applied>" (ids as ':c' above; the hold id,
--         drawn from the id of the call that began the read hold, is what
--         an RUnlock names)
-- KEYS[5] waiting writers zset: writer token -> place deadline (ms); while
--         one lives, new readers wait
-- KEYS[6] waiting readers hash: reader token -> "<place deadline ms> <ttl ms> <call id>"
-- KEYS[7] call ids zset (see lib.lua): for a lock call 1 took, re-entered
--         or was granted the hold, 2 abandoned or refused for good (a try
--         refused, an upgrade): a repeat within the replay window changes
--         nothing
-- KEYS[8] writers' queue zset: queued writer token -> arrival (server µs;
--         see lib.lua's arrive); a writer queues once it has waited past
--         the starvation threshold, or when others are queued, and the
--         queue's head gets the lock first
-- KEYS[9] queued writers hash: queued writer token -> "<ttl ms> <call id>
--         <secret>";
--         a queue place lives as long as the writer's place in KEYS[5]
-- ARGV[1] 'r' to read, 'w' to write
-- ARGV[2] owner token
-- ARGV[3] lease TTL (ms)
-- ARGV[4] call id (the same for every attempt of one lock call)
-- ARGV[5] '1' when the caller waits if refused (it takes a place), '0' for a try
-- ARGV[6] idle expiry of the fence hash (ms)
-- ARGV[7] '1' when the owner counts re-entries itself (client reentrancy):
--         a re-entry then leaves the count in Redis at 1 (its call id is
--         remembered all the same); '2' (script reentrancy) or '3' (client
--         reentrancy) with a lease not to be extended past a bound
--         (FixedLease, MaxHold): a re-entry then leaves the hold's expiry
--         as the lock call that took it or its last renewal set it
-- ARGV[8] '1' when the caller (a waiting writer) has waited past the
--         starvation threshold: a refused attempt then queues it
-- ARGV[9] the call's secret, proof of a hand-over to it (see lib.lua)
-- ARGV[10] the attempt's bound (server ms; see lib.lua's stale)
-- Reply: {1, v} the caller took or re-entered the hold now, {2, v} the
--        hold was this call's already (granted to it while it waited, or a
--        repeat), where v is the fencing token for a write hold and the
--        hold id for a read hold (with ARGV[7] '2' or '3', a re-entry's
--        and a repeat's with a third element, the ms the hold has left:
--        see lib.lua's granted_left); {4, 0} write refused because the owner
--        holds a read lock (an upgrade); {3, 0} foreign data in the keys;
--        {0, ms, server time µs} refused: try again after at most ms (see
--        lib.lua's refusal); {5, 0} the call took effect and its hold has
--        ended: it takes nothing any more.

-- Reply {6, server time ms}: this copy arrived after its bound, or its
-- bound is too far ahead; it takes nothing (see lib.lua's stale).
if stale(ARGV[10]) then
  return { 6, now_ms }
end

local mode, tok, ttl, id = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local wait = ARGV[5] == '1'
local counted = ARGV[7] ~= '1' and ARGV[7] ~= '3' -- re-entries are counted here
local fixed = ARGV[7] == '2' or ARGV[7] == '3' -- re-entries do not extend

-- A refusal: a waiting call (wait) tries again later under the same id; a
-- try is done, and is remembered so that a late copy of it cannot take the
-- lock. The wait is at most a TTL: a deadline from foreign data may be far
-- off, or not fit a reply's integer.
local function refused(deadline)
  if not wait then
    noted(id, 2)
  else
    -- A release may hand the lock to a waiting writer for that writer's
    -- TTL, which may end long before deadline: a writer that died (nobody
    -- refreshes its place) would then keep the others asleep after its
    -- own hold ended. Come back by the time the earliest writer's place
    -- lapses, so that a dead waiter delays the others by its own TTL at
    -- most.
    prune_writers()
    local first = tonumber(redis.call('ZRANGE', WW, '0', '0', 'WITHSCORES')[2])
    if first and first < deadline then
      deadline = first
    end
  end
  return out(refusal(math.max(math.min(deadline - now, ttl), 1)))
end

-- A reader looks at the readers first thing (its own read hold included).
if mode == 'r' then
  prune_readers()
end

-- A repeat of a call that took effect, or of one abandoned or refused for
-- good, changes nothing: it answers with the hold it finds, if any.
local done = recall(X, id)
if done then
  if done == 1 then
    if mode == 'r' then
      local rec = redis.call('HGET', RC, tok)
      local cnt, rid, ids = nil, nil, nil
      if rec then
        cnt, rid, ids = read_rec(rec)
      end
      if cnt and applied(X, ids, id, rid) then
        if fixed then
          return granted_left(2, tonumber(rid), tonumber(redis.call('ZSCORE', R, tok) or 0) - now)
        end
        return { 2, tonumber(rid) }
      end
    else
      local cur = redis.call('HMGET', W, tok, ':f', ':c')
      if cur[1] and tonumber(cur[2]) and applied(X, cur[3], id, cur[2]) then
        if fixed then
          return granted_left(2, tonumber(cur[2]), redis.call('PTTL', W))
        end
        return { 2, tonumber(cur[2]) }
      end
    end
    -- The hold it took effect on ended: the call is over (a late copy, or
    -- a live call that learns only now of a hold handed to it). The owner
    -- may hold afresh by then, with nothing of the call in that hold.
    return { 5, 0 }
  end
  return refusal(1)
end

if mode == 'r' then
  local rec = redis.call('HGET', RC, tok)
  if rec then
    -- Re-entry (never blocked by a waiting writer: the owner would wait for
    -- itself), or the hold a writer's unlock granted this waiting call.
    local cnt, rid, ids = read_rec(rec)
    if not cnt then
      return { 3, 0 }
    end
    if seen(ids, id) then
      return { 2, tonumber(rid) }
    end
    if counted then
      cnt = cnt + 1
    end
    -- Remembered also with client reentrancy (see rwmutex_unlock.lua's
    -- ARGV[9]).
    local kept, gone = remember_dropping(ids, id)
    write_rec(tok, cnt, rid, kept)
    dropped(gone, rid)
    -- A re-entry never moves the expiry earlier, and with a fixed lease
    -- it does not move it at all.
    local s = tonumber(redis.call('ZSCORE', R, tok) or 0)
    if not fixed and now + ttl > s then
      redis.call('ZADD', R, num(now + ttl), tok)
      grow(R, RC, ttl)
    end
    noted(id, 1)
    if fixed then
      -- The read hold's deadline stays: the grant says how long it has
      -- left (see lib.lua's granted_left).
      return out(granted_left(1, tonumber(rid), s - now))
    end
    return out({ 1, tonumber(rid) })
  end
  -- Nobody writes, waits to write, or waits to read: the common case, in
  -- one look.
  if redis.call('EXISTS', W, WW, RQ) > 0 then
    prune_writers()
    local left = redis.call('PTTL', W) -- -2: no writer
    local held = left ~= -2
    local mine = held and redis.call('HEXISTS', W, tok) == 1
    local writers = redis.call('ZCARD', WW)
    local placed = writers > 0 and redis.call('ZSCORE', WW, tok)
    if placed then
      writers = writers - 1
    end
    -- The write holder may read (a downgrade); anyone else waits for the
    -- writer, and for waiting writers too (writer preference).
    if not mine and (held or writers > 0) then
      if left == -1 or (held and redis.call('HEXISTS', W, ':f') == 0) then
        -- A writer hash without an expiry (a PERSIST, a restore), or
        -- without the fencing token every write hold has, is foreign
        -- data: say so, and write nothing, rather than wait for it.
        return { 3, 0 }
      end
      if wait then
        local place = tonumber(place_ms(ARGV[3]))
        redis.call('HSET', RQ, tok, string.format('%s %d %s', num(now + place), ttl, id))
        if redis.call('PTTL', RQ) < place then
          redis.call('PEXPIRE', RQ, place_ms(ARGV[3]))
        end
      end
      if held then
        return refused(now + left)
      end
      -- The earliest writer place: if its writer died, the place lapses then.
      local first = redis.call('ZRANGE', WW, '0', '0', 'WITHSCORES')
      return refused(tonumber(first[2]))
    end
    -- The waiting place goes first: if its key holds foreign data, the
    -- error comes before the hold is written.
    redis.call('HDEL', RQ, tok)
    if placed then
      -- A Lock call of the owner waits: once the owner reads, it is an
      -- upgrade, refused at its next attempt. Its place goes now, and
      -- every waiter tries again: that call, to be refused at once, and
      -- the readers its place held back, to go on.
      unplace(tok)
      redis.call('PUBLISH', W, '')
    end
  end
  local rid = hold_id(id)
  write_rec(tok, 1, num(rid), id)
  redis.call('ZADD', R, num(now + ttl), tok)
  -- A readers zset that prune_readers found absent was created by this
  -- ZADD, without an expiry: no need to read it.
  grow(R, RC, ttl, readers_low and not readers_low[1] and -1 or nil)
  noted(id, 1)
  return out({ 1, rid })
end

-- Write.
local cur = redis.call('HMGET', W, tok, ':f', ':c')
if cur[1] then
  -- Re-entry, or the hold handed over to this waiting call.
  local f = tonumber(cur[2])
  if not f then
    return { 3, 0 }
  end
  if seen(cur[3], id) then
    return { 2, f }
  end
  if counted then
    redis.call('HINCRBY', W, tok, '1')
  end
  -- Remembered also with client reentrancy (see rwmutex_unlock.lua's
  -- ARGV[9]).
  local kept, gone = remember_dropping(cur[3], id)
  redis.call('HSET', W, ':c', kept)
  dropped(gone, cur[2])
  -- A re-entry never moves the expiry earlier, and with a fixed lease it
  -- does not move it at all.
  if not fixed then
    extend_key(W, ttl)
  end
  noted(id, 1)
  if fixed then
    return out(granted_left(1, f, redis.call('PTTL', W)))
  end
  return out({ 1, f })
end

local function enqueue()
  -- The place lasts one lease TTL (200 ms at least, see place_ms) and is
  -- refreshed by every attempt; while it lives, new readers wait.
  local place = place_ms(ARGV[3])
  redis.call('ZADD', WW, num(now + tonumber(place)), tok)
  grow(WW, nil, tonumber(place))
  if ARGV[8] == '1' or redis.call('EXISTS', WQ) == 1 then
    -- Starving, or behind writers that starve: keep the arrival order. The
    -- queue keys outlive every place in them; each place lapses alone.
    -- Each key gets its expiry right after its write: if the next key
    -- holds foreign data, the error leaves no key without one.
    redis.call('HSET', WD, tok, string.format('%d %s %s', ttl, id, ARGV[9]))
    extend_key(WD, place)
    arrive(WQ, tok)
    extend_key(WQ, place)
  end
end

-- Held by another writer (a hold always has ':f'), or by readers?
if cur[2] or redis.call('EXISTS', W, R) > 0 then
  prune()
  if redis.call('HEXISTS', RC, tok) == 1 then
    -- The owner reads: waiting for the write lock would wait for itself.
    -- The call is refused for good. Its waiting place (the owner's, if
    -- one of its Lock calls waited before it read) goes, and the readers
    -- it held back go on at once, as after a writer that gave up.
    local placed = redis.call('ZSCORE', WW, tok)
    unplace(tok)
    if placed and redis.call('EXISTS', W, WW) == 0 and redis.call('EXISTS', RQ) == 1 then
      redis.call('PUBLISH', W, '')
    end
    noted(id, 2)
    return out({ 4, 0 })
  end
  local left = redis.call('PTTL', W) -- -2: no writer
  if left ~= -2 then
    if left == -1 or not cur[2] then
      -- A writer hash without an expiry (a PERSIST, a restore), or
      -- without the fencing token every write hold has, is foreign data:
      -- say so, and write nothing, rather than wait for it.
      return { 3, 0 }
    end
    if wait then
      enqueue()
    end
    return refused(now + left)
  end
  local first = redis.call('ZRANGE', R, '0', '0', 'WITHSCORES')
  -- dsync writes a reader into the readers zset and hash together: one in
  -- the zset alone is foreign data, dropped rather than waited for.
  for _ = 1, 100 do
    if not first[2] or redis.call('HEXISTS', RC, first[1]) == 1 then
      break
    end
    redis.call('ZREM', R, first[1])
    first = redis.call('ZRANGE', R, '0', '0', 'WITHSCORES')
  end
  if first[2] then
    if wait then
      enqueue()
    end
    -- The last reader to leave hands the lock to the queue's head or wakes
    -- the writers; one that dies without leaving is gone at its deadline.
    return refused(tonumber(first[2]))
  end
  -- Only foreign readers were left, and are gone: the lock is free.
end
local h, dl = head()
if h and h ~= tok then
  -- Free, but a starving writer is first in line: queue behind it and
  -- wait until it takes the lock (its attempt is due: the lock was freed
  -- without a hand-over, by an expiry) or its place lapses.
  if wait then
    enqueue()
  end
  return refused(dl)
end

-- Fresh write hold. The token and the places go first: foreign data
-- there makes the call fail before the hold is written.
local f = next_fence(ARGV[6])
if not f then
  return { 3, 0 }
end
if h then
  unplace(tok)
elseif redis.call('ZREM', WW, tok) == 1 then
  -- A waiting place, but no queue place: the queue is empty (head found
  -- none).
  prune_writers()
  fit(WW)
end
-- The hold keeps the call ids' prune marker as this script found it, for
-- its Unlock ('' when there is none).
redis.call('HSET', W, tok, '1', ':f', f, ':c', id, ':p', prune_mark[X] or '')
redis.call('PEXPIRE', W, ARGV[3]) -- ttl as sent
noted(id, 1)
return out({ 1, tonumber(f) })
