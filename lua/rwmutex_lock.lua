-- rwmutex_lock: take or re-enter an RWMutex for reading or for writing, or
-- report how long to wait.
--
-- KEYS[1] writer hash: <owner token> -> reentry count, ':f' fencing token of
--         the write hold, ':c' ids of the last calls applied to it (at most
--         16, space-separated, latest last)
-- KEYS[2] fence hash (outlives holds, idle expiry): 'n' last fencing token
-- KEYS[3] readers zset: reader token -> lease deadline (server ms)
-- KEYS[4] readers hash: reader token -> "<reentry count> <ids of the last
--         calls applied>" (as ':c' above)
-- KEYS[5] waiting writers zset: writer token -> place deadline (ms); while
--         one lives, new readers wait
-- KEYS[6] waiting readers hash: reader token -> "<place deadline ms> <ttl ms> <call id>"
-- KEYS[7] finished calls zset: call id -> when it may be forgotten (ms); holds
--         the ids of full releases (a repeat answers as before) and of
--         abandoned calls (a late arrival must not take effect)
-- KEYS[8] writers' queue zset: queued writer token -> arrival (server µs);
--         a writer queues once it has waited past the starvation threshold,
--         or when others are queued, and the queue's head gets the lock first
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
--         a re-entry then leaves the count in Redis at 1
-- ARGV[8] '1' when the caller (a waiting writer) has waited past the
--         starvation threshold: a refused attempt then queues it
-- ARGV[9] the call's secret, proof of a hand-over to it (see lib.lua)
-- Reply: {1, v} the caller took or re-entered the hold now, {2, v} the
--        hold was this call's already (granted to it while it waited, or a
--        repeat), where v is the fencing token for a write hold and 1 for a
--        read hold; {4, 0} write refused because the owner holds a read
--        lock (an upgrade); {3, 0} foreign data in the keys; {0, ms}
--        refused: try again after at most ms.

local mode, tok, ttl, id = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local wait = ARGV[5] == '1'
local counted = ARGV[7] ~= '1' -- re-entries are counted here
local function retry_at(deadline)
  -- At most a TTL: a deadline from foreign data may be far off, or not
  -- fit a reply's integer.
  return { 0, math.max(math.min(deadline - now, ttl), 1) }
end

-- A call its caller abandoned must not take effect when it arrives late.
if redis.call('ZSCORE', X, id) then
  return { 0, 1 }
end

if mode == 'r' then
  local rec = redis.call('HGET', RC, tok)
  if rec then
    -- Re-entry (never blocked by a waiting writer: the owner would wait for
    -- itself), or a repeat of a recent call (a retry after a lost reply, or
    -- a hold granted to this waiter by a writer's unlock): a repeat changes
    -- nothing.
    local cnt, ids = string.match(rec, '^(%d+) (.*)$')
    if seen(ids, id) then
      return { 2, 1 }
    end
    if counted then
      redis.call('HSET', RC, tok, string.format('%d %s', tonumber(cnt) + 1, remember(ids, id)))
    end
    local s = tonumber(redis.call('ZSCORE', R, tok) or 0)
    if now + ttl > s then
      redis.call('ZADD', R, num(now + ttl), tok)
      fit(R, RC)
    end
    return { 1, 1 }
  end
  local left = redis.call('PTTL', W) -- -2: no writer
  local held = left ~= -2
  local mine = held and redis.call('HEXISTS', W, tok) == 1
  local writers = redis.call('ZCARD', WW)
  if redis.call('ZSCORE', WW, tok) then
    writers = writers - 1
  end
  -- The write holder may read (a downgrade); anyone else waits for the
  -- writer, and for waiting writers too (writer preference).
  if not mine and (held or writers > 0) then
    if left == -1 then
      -- A writer hash without an expiry is foreign data (a PERSIST, a
      -- restore): say so, and write nothing.
      return { 3, 0 }
    end
    if wait then
      redis.call('HSET', RQ, tok, string.format('%s %d %s', num(now + ttl), ttl, id))
      if redis.call('PTTL', RQ) < ttl then
        redis.call('PEXPIRE', RQ, ttl)
      end
    end
    if held then
      return retry_at(now + left)
    end
    -- The earliest writer place: if its writer died, the place lapses then.
    local first = redis.call('ZRANGE', WW, 0, 0, 'WITHSCORES')
    return retry_at(tonumber(first[2]))
  end
  -- The waiting place goes first: if its key holds foreign data, the
  -- error comes before the hold is written.
  redis.call('HDEL', RQ, tok)
  redis.call('HSET', RC, tok, '1 ' .. id)
  redis.call('ZADD', R, num(now + ttl), tok)
  fit(R, RC)
  return { 1, 1 }
end

-- Write.
local cnt = redis.call('HGET', W, tok)
if cnt then
  -- Re-entry, or a repeat of a recent call: a repeat changes nothing.
  local ids = redis.call('HGET', W, ':c')
  local f = tonumber(redis.call('HGET', W, ':f'))
  if not f then
    return { 3, 0 }
  end
  if seen(ids, id) then
    return { 2, f }
  end
  if counted then
    redis.call('HINCRBY', W, tok, 1)
    redis.call('HSET', W, ':c', remember(ids, id))
  end
  -- A re-entry never moves the expiry earlier.
  extend_key(W, ttl)
  return { 1, f }
end

if redis.call('HEXISTS', RC, tok) == 1 then
  -- The owner reads: waiting for the write lock would wait for itself.
  unplace(tok)
  return { 4, 0 }
end

local function enqueue()
  -- The place lasts one lease TTL and is refreshed by every attempt; while
  -- it lives, new readers wait.
  redis.call('ZADD', WW, num(now + ttl), tok)
  fit(WW)
  if ARGV[8] == '1' or redis.call('EXISTS', WQ) == 1 then
    -- Starving, or behind writers that starve: keep the arrival order. The
    -- queue keys outlive every place in them; each place lapses alone.
    -- Each key gets its expiry right after its write: if the next key
    -- holds foreign data, the error leaves no key without one.
    redis.call('HSET', WD, tok, string.format('%d %s %s', ttl, id, ARGV[9]))
    extend_key(WD, ttl)
    redis.call('ZADD', WQ, 'NX', num(now_us), tok)
    extend_key(WQ, ttl)
  end
end

local left = redis.call('PTTL', W) -- -2: no writer
if left ~= -2 then
  if left == -1 then
    -- A writer hash without an expiry is foreign data (a PERSIST, a
    -- restore): say so, and write nothing.
    return { 3, 0 }
  end
  if wait then
    enqueue()
  end
  return retry_at(now + left)
end
local first = redis.call('ZRANGE', R, 0, 0, 'WITHSCORES')
-- dsync writes a reader into the readers zset and hash together: one in
-- the zset alone is foreign data, dropped rather than waited for.
for _ = 1, 100 do
  if not first[2] or redis.call('HEXISTS', RC, first[1]) == 1 then
    break
  end
  redis.call('ZREM', R, first[1])
  first = redis.call('ZRANGE', R, 0, 0, 'WITHSCORES')
end
if first[2] then
  if wait then
    enqueue()
  end
  -- The last reader to leave hands the lock to the queue's head or wakes
  -- the writers; one that dies without leaving is gone at its deadline.
  return retry_at(tonumber(first[2]))
end
local h, dl = head()
if h and h ~= tok then
  -- Free, but a starving writer is first in line: queue behind it and
  -- wait until it takes the lock (its attempt is due: the lock was freed
  -- without a hand-over, by an expiry) or its place lapses.
  if wait then
    enqueue()
  end
  return retry_at(dl)
end

-- Fresh write hold. The token and the places go first: foreign data
-- there makes the call fail before the hold is written.
local f = next_fence(ARGV[6])
if not f then
  return { 3, 0 }
end
unplace(tok)
redis.call('HSET', W, tok, 1, ':f', f, ':c', id)
redis.call('PEXPIRE', W, ttl)
return { 1, tonumber(f) }
