-- rwmutex_unlock: release one level of an RWMutex read or write hold, or
-- clean up after a lock call its caller abandoned. A writer's full release
-- makes every waiting reader a holder at once, as sync.RWMutex's Unlock does.
--
-- KEYS[1..9] as in rwmutex_lock.lua (writer hash, fence hash, readers zset,
--         readers hash, waiting writers zset, waiting readers hash, finished
--         calls zset, writers' queue zset, queued writers hash)
-- ARGV[1] 'r' for a read hold, 'w' for a write hold
-- ARGV[2] owner token
-- ARGV[3] call id of this unlock
-- ARGV[4] notification channel: '' after a release that lets waiters try
--         again; "<owner token> <call id> <fencing token>" after a hand-over
--         of the write lock to the first queued writer, whose lock call (id)
--         holds it with that token without another attempt
-- ARGV[5] how long finished call ids are remembered (ms)
-- ARGV[6] '' for an unlock. For a lock call its caller abandoned (ctx done,
--         reply lost), that call's id: the call is marked finished so it
--         cannot take effect later, its waiting and queue places are
--         dropped, and one level of the hold is released only if that call
--         took or re-entered it, or was handed it (its id is among the
--         hold's remembered call ids).
-- ARGV[7] (quorum mode only, else '') the fencing token of the write hold:
--         this master's counter is raised to it, so the next writer's token
--         is larger even where another master's clock ran ahead when it was
--         issued
-- ARGV[8] idle expiry of the fence hash (ms)
-- Reply: 1 released (or handed over), 2 still held by the owner (its count
--        went down), 0 the owner does not hold it.
--
-- A release that frees the lock (the last reader's, or a writer's with no
-- reader waiting) hands it straight to the first queued writer, if any;
-- a writer's full release admits every waiting reader at once instead, as
-- sync.RWMutex's Unlock does, so that writers cannot starve readers.

local mode, tok, id, ch, keep, guard = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
local idle = ARGV[8]
local function finish(cid)
  redis.call('ZADD', X, num(now + keep), cid)
  redis.call('PEXPIRE', X, keep)
end

if ARGV[7] and ARGV[7] ~= '' then
  local floor = tonumber(ARGV[7])
  if floor and floor > (tonumber(redis.call('HGET', F, 'n')) or 0) then
    redis.call('HSET', F, 'n', ARGV[7])
    redis.call('PEXPIRE', F, idle)
  end
end

-- A repeat of an unlock that released answers as before.
if redis.call('ZSCORE', X, id) then
  return 1
end

if guard ~= '' then
  finish(guard)
  if mode == 'w' then
    -- The places are the abandoned call's unless another call of the same
    -- owner queued since (its id is in the queue place).
    local d = redis.call('HGET', WD, tok)
    if not d or string.match(d, '^%d+ (%S+)') == guard then
      if redis.call('ZSCORE', WW, tok) then
        unplace(tok)
        if redis.call('EXISTS', W) == 0 then
          if redis.call('EXISTS', R) == 0 and hand_over(ch, idle) then
            -- It may have been first in line for the free lock.
          elseif redis.call('EXISTS', WW) == 0 and redis.call('EXISTS', RQ) == 1 then
            -- Readers held back by this writer's place may go on at once.
            redis.call('PUBLISH', ch, '')
          end
        end
      end
    end
    if not seen(redis.call('HGET', W, ':c'), guard) then
      return 0
    end
  else
    local d = redis.call('HGET', RQ, tok)
    if d and string.match(d, '(%S+)$') == guard then
      redis.call('HDEL', RQ, tok)
    end
    local rec = redis.call('HGET', RC, tok)
    if not rec or not seen(string.match(rec, '^%d+ (.*)$'), guard) then
      return 0
    end
  end
end

if mode == 'r' then
  local rec = redis.call('HGET', RC, tok)
  if not rec then
    return 0
  end
  local cnt, ids = string.match(rec, '^(%d+) (.*)$')
  if seen(ids, id) then
    -- A repeat of an unlock that only lowered the count.
    return 2
  end
  if tonumber(cnt) > 1 then
    redis.call('HSET', RC, tok, string.format('%d %s', tonumber(cnt) - 1, remember(ids, id)))
    return 2
  end
  redis.call('HDEL', RC, tok)
  redis.call('ZREM', R, tok)
  finish(id)
  fit(R, RC)
  -- The last reader out hands the lock to the first queued writer, or
  -- wakes the waiting writers (unless the owner still writes: a downgrade
  -- undone; its Unlock will).
  if redis.call('EXISTS', R) == 0 and redis.call('EXISTS', W) == 0
      and not hand_over(ch, idle) and redis.call('EXISTS', WW) == 1 then
    redis.call('PUBLISH', ch, '')
  end
  return 1
end

local cnt = redis.call('HGET', W, tok)
if not cnt then
  return 0
end
local ids = redis.call('HGET', W, ':c')
if seen(ids, id) then
  -- A repeat of an unlock that only lowered the count.
  return 2
end
if tonumber(cnt) > 1 then
  redis.call('HINCRBY', W, tok, -1)
  redis.call('HSET', W, ':c', remember(ids, id))
  return 2
end
redis.call('DEL', W)
finish(id)

-- Every reader that waited for this writer holds the lock now, with its own
-- lease and its lock call's id, so that call's next attempt finds the hold
-- and changes nothing; writers that wait wait for these readers.
local q = redis.call('HGETALL', RQ)
local admitted = 0
for i = 1, #q, 2 do
  local rt = q[i]
  local dl, rttl, cid = string.match(q[i + 1], '^(%d+) (%d+) (%S+)$')
  if dl and tonumber(dl) > now and not redis.call('ZSCORE', X, cid) then
    local c, ids = 0, nil
    local rec = redis.call('HGET', RC, rt)
    if rec then
      c, ids = string.match(rec, '^(%d+) (.*)$')
      c = tonumber(c)
    end
    if not seen(ids, cid) then
      redis.call('HSET', RC, rt, string.format('%d %s', c + 1, remember(ids, cid)))
    end
    local s = tonumber(redis.call('ZSCORE', R, rt) or 0)
    if now + tonumber(rttl) > s then
      redis.call('ZADD', R, num(now + tonumber(rttl)), rt)
    end
    admitted = admitted + 1
  end
end
if #q > 0 then
  redis.call('DEL', RQ)
  fit(R, RC)
end
-- With no reader waiting, and none left (the owner may keep a read hold: a
-- downgrade), the first queued writer gets the lock.
if admitted == 0 and redis.call('EXISTS', R) == 0 and hand_over(ch, idle) then
  return 1
end
if #q > 0 or redis.call('EXISTS', WW) == 1 then
  redis.call('PUBLISH', ch, '')
end
return 1
