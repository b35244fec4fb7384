-- rwmutex_unlock: release one level of an RWMutex read or write hold, or
-- clean up after a lock call its caller abandoned. A writer's full release
-- makes every waiting reader a holder at once, as sync.RWMutex's Unlock does.
--
-- KEYS[1..9] as in rwmutex_lock.lua (writer hash, fence hash, readers zset,
--         readers hash, waiting writers zset, waiting readers hash, call ids
--         zset, writers' queue zset, queued writers hash); call ids of
--         unlocks: 1 released, 2 lowered the count, 0 did not hold
-- ARGV[1] 'r' for a read hold, 'w' for a write hold
-- ARGV[2] owner token
-- ARGV[3] call id of this unlock
-- ARGV[4] notification channel: '' is published after a release that lets
--         waiters try again; a hand-over of the write lock to the first
--         queued writer, whose lock call then holds it without another
--         attempt, is published as lib.lua's publish_handover says
-- ARGV[5] the hold this unlock ends: the fencing token of the write hold,
--         or the hold id of the read hold (see rwmutex_lock.lua); '' when
--         the caller does not know it. A hold with another token or id is
--         not the caller's: a later hold of the same owner is never ended.
-- ARGV[6] '' for an unlock. For a lock call its caller abandoned (ctx done,
--         reply lost), that call's id: the call is marked abandoned so it
--         cannot take effect later, its waiting and queue places are
--         dropped, and one level of the hold is released only if that call
--         took or re-entered it, or was handed it (its id is among the
--         hold's applied call ids), and only once.
-- ARGV[7] (quorum mode only, else '') the fencing token of the write hold:
--         this master's counter is raised to it, so the next writer's token
--         is larger even where another master's clock ran ahead when it was
--         issued
-- ARGV[8] idle expiry of the fence hash (ms)
-- ARGV[9] '1' when the owner counts re-entries itself (client
--         reentrancy): an abandon (ARGV[6]) leaves the hold alone while
--         other calls that took or re-entered it are remembered with it,
--         since the process counts them and releases the hold itself
-- ARGV[10..13] (a pass, optional; write holds only) the holder token,
--         lock call id and lease TTL (ms) of a writer of the same Client
--         waiting for the name in the process (see cohort.go), and the
--         most passes in a row while writers wait in Redis: a full release
--         gives the write lock straight to that call, a fresh hold with a
--         new fencing token, unless a reader waits or holds (a writer's
--         release admits the readers that waited for it), its id is
--         remembered (abandoned), or writers wait in Redis and the hold is
--         the end of that many passes in a row (':k'). Then the release
--         goes on as without a pass; when readers wait or hold, that
--         writer also gets a waiting place (as its refused attempt would),
--         so that readers who come after it wait for it.
-- ARGV[14] (an unlock, ARGV[6] '') the unlock's bound (server ms; see
--         lib.lua's stale): a copy that arrives past it, when its id may be
--         forgotten, changes nothing. An unlock that names no hold ends a
--         level of whatever hold of the owner it finds, and one that names
--         a hold whose count an unlock lowered may be a copy of that
--         unlock: either would end a level again. (A write unlock naming a
--         hold no unlock lowered is no copy of a run: it skips the check.)
-- Reply: 1 released (or handed over), 2 still held by the owner (its count
--        went down), 0 the owner does not hold it, {4, fencing token}
--        released and passed (ARGV[10..13]) with that token; {6, server
--        time ms} past its bound (ARGV[14]), nothing changed. An
--        Unlock that names no hold and releases one answers {1, fencing
--        token} with that hold's token (see mutex_unlock.lua), an RUnlock
--        that names none and ends a read hold {1, hold id}. A repeat
--        within the replay window answers as the first run did (1 for a
--        pass) and changes nothing.
--
-- A release that frees the lock (the last reader's, or a writer's with no
-- reader waiting) hands it straight to the first queued writer, if any;
-- a writer's full release admits every waiting reader at once instead, as
-- sync.RWMutex's Unlock does, so that writers cannot starve readers.

local mode, tok, id, ch, name, guard = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local idle = ARGV[8]
local named = name ~= nil and name ~= ''
if guard == '' and not named and ARGV[14] and stale(ARGV[14]) then
  return { 6, now_ms }
end

if ARGV[7] and ARGV[7] ~= '' then
  local floor = tonumber(ARGV[7])
  local fence = redis.call('HMGET', F, 'n', 'e')
  if floor and floor > (tonumber(fence[1]) or 0) then
    set_fence(F, ARGV[7], fence[2], idle)
  end
end

-- An Unlock or RUnlock that names no hold: the fencing token of the write
-- hold, or the id of the read hold, it ended, which it answers with, and
-- notes for its repeats (see lib.lua's ended_by).
local ended

-- The answer of an unlock (not of a clean-up, whose id is new each time),
-- remembered. A named unlock that found no hold needs no memory: the hold
-- it names can never come back.
local function answer(code)
  if guard == '' and (code ~= 0 or not named) then
    noted(id, code)
  end
  if code == 1 and ended then
    noted(tagged(id, ended), 1)
    return out({ 1, tonumber(ended) })
  end
  return out(code)
end

-- The writer hash, for a write unlock that names its hold.
local wcur, fresh
if guard == '' then
  -- A repeat of an unlock answers as before. A write Unlock that names a
  -- hold that is there and whose count no Unlock lowered (':d' unset) is
  -- no repeat: a run of it would have ended the hold or set ':d' (write
  -- holds are never given a fencing token twice). It need not look up its
  -- id, and takes the prune marker from the hold (see lib.lua's
  -- cached_mark).
  if mode == 'w' and named then
    wcur = redis.call('HMGET', W, tok, ':f', ':c', ':d', ':p', ':k')
    fresh = tonumber(wcur[1]) and wcur[2] == name and not wcur[4]
  end
  if fresh then
    cached_mark(X, wcur[5], now)
  else
    if named and ARGV[14] and stale(ARGV[14]) then
      return { 6, now_ms }
    end
    local done = recall(X, id)
    if done == 1 and not named then
      local e = ended_by(X, id)
      local f = tonumber(e)
      if f then
        recall_again(X, id, done, e)
        return { 1, f }
      end
    end
    if done then
      recall_again(X, id, done)
      return done
    end
  end
else
  prune()
  local was = recall(X, guard)
  if was == 2 then
    -- Cleaned up already (or refused for good): nothing is left to undo.
    return 0
  end
  noted(guard, 2)
  -- Whether the call took effect on the hold named hold (its fencing
  -- token, or a read hold's id) whose list of applied calls is list: its
  -- id is in the list, or was dropped from it by later calls of the
  -- holder (see rwmutex_lib.lua's dropped).
  local function undoable(list, hold)
    return seen(list, guard) or (was == 1 and hold and redis.call('ZSCORE', X, tagged(guard, hold)) ~= false)
  end
  if mode == 'w' then
    -- The places are the abandoned call's unless another call of the same
    -- owner queued since (its id is in the queue place).
    local d = redis.call('HGET', WD, tok)
    if not d or string.match(d, '^%d+ (%S+)') == guard then
      if redis.call('ZSCORE', WW, tok) then
        -- Other waiting calls of the owner shared the place: they queue
        -- again at once.
        unplace(tok)
        wake_holder(ch, guard, tok)
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
    local w = redis.call('HMGET', W, ':c', ':f')
    if not undoable(w[1], w[2]) then
      return out(0)
    end
  else
    local d = redis.call('HGET', RQ, tok)
    if d and string.match(d, '(%S+)$') == guard then
      redis.call('HDEL', RQ, tok)
      wake_holder(ch, guard, tok)
    end
    local rec = redis.call('HGET', RC, tok)
    local ids, rid
    if rec then
      rid, ids = select(2, read_rec(rec))
    end
    if not undoable(ids, rid) then
      return out(0)
    end
  end
end

if mode == 'r' then
  prune_readers()
  local rec = redis.call('HGET', RC, tok)
  local cnt, rid, ids
  if rec then
    cnt, rid, ids = read_rec(rec)
  end
  if not cnt or (named and rid ~= name) then
    return answer(0)
  end
  if guard ~= '' and ARGV[9] == '1' then
    -- Client reentrancy: other calls of the process took or re-entered
    -- the hold (the count here is 1 whatever their number), and the
    -- process releases it once they are done.
    local rest = forget(ids, guard)
    if rest ~= '' then
      write_rec(tok, cnt, rid, rest)
      return answer(2)
    end
  end
  if cnt > 1 then
    if guard ~= '' then
      ids = forget(ids, guard)
    end
    write_rec(tok, cnt - 1, rid, ids)
    return answer(2)
  end
  redis.call('ZREM', R, tok)
  if guard == '' and not named and tonumber(rid) < 9007199254740992 then
    ended = rid
  end
  -- The caller was the only reader, as prune_readers found the zset
  -- (nothing wrote it since but this ZREM): none is left.
  local alone = readers_low and #readers_low == 2 and readers_low[1] == tok
  local top = alone and {} or redis.call('ZRANGE', R, '-1', '-1', 'WITHSCORES')
  if top[2] then
    -- Other readers hold. The record goes before the expiries are fitted:
    -- a deadline from foreign data there makes fit fail, and the record
    -- must not outlive the hold without an expiry.
    redis.call('HDEL', RC, tok)
    fit(R, RC, top)
  else
    fit(R, RC, top)
    -- No reader left (fit deleted the readers hash): the lock is free
    -- unless the owner still writes (a downgrade undone; its Unlock will
    -- hand it on). The last reader out hands it to the first queued
    -- writer, or wakes the waiting writers.
    if redis.call('EXISTS', W, WW, WQ) > 0 and redis.call('EXISTS', W) == 0
        and not hand_over(ch, idle) and redis.call('EXISTS', WW) == 1 then
      redis.call('PUBLISH', ch, '')
    end
  end
  return answer(1)
end

local cur = wcur or redis.call('HMGET', W, tok, ':f', ':c', ':d', ':p', ':k')
local cnt = tonumber(cur[1])
if not cnt or (named and cur[2] ~= name) then
  return answer(0)
end
if guard ~= '' and ARGV[9] == '1' then
  -- Client reentrancy, as for a read hold above.
  local rest = forget(cur[3], guard)
  if rest ~= '' then
    redis.call('HSET', W, ':c', rest)
    return answer(2)
  end
end
if cnt > 1 then
  redis.call('HINCRBY', W, tok, '-1')
  if guard ~= '' then
    redis.call('HSET', W, ':c', forget(cur[3], guard))
  elseif not cur[4] then
    -- From now on a copy of this Unlock must be told from a new one.
    redis.call('HSET', W, ':d', '1')
  end
  return answer(2)
end
redis.call('DEL', W)
if guard == '' and not named and tonumber(cur[2]) then
  ended = cur[2]
end

local ptok, pid = ARGV[10], ARGV[11]
if guard == '' and ptok and ptok ~= '' then
  if redis.call('EXISTS', RQ, R) == 0 then
    -- A pass: the next write hold is the waiting call's, with its own TTL
    -- and id, as a hand-over's is. No reader waits or holds (the owner's
    -- own read hold, a downgrade, would be one).
    local k = tonumber(cur[6]) or 0
    if (k < tonumber(ARGV[13]) or redis.call('EXISTS', WW, WQ) == 0) and not recall(X, pid) then
      local f = next_fence(idle)
      if f then
        redis.call('HSET', W, ptok, '1', ':f', f, ':c', pid, ':p', prune_mark[X] or '', ':k', num(k + 1))
        redis.call('PEXPIRE', W, ARGV[12])
        noted(pid, 1)
        noted(id, 1)
        return out({ 4, tonumber(f) })
      end
    end
  elseif not recall(X, pid) then
    -- Readers go first, and the writer waiting in the process gets the
    -- waiting place its own refused attempt would take: it has waited
    -- since before this release, so the readers that come after it wait
    -- for it (writer preference), as they would for a writer of another
    -- process. Its next attempt keeps the place; if the call gives up
    -- instead, its abandon drops it (see cohort.go), else it lapses.
    redis.call('ZADD', WW, num(now + tonumber(ARGV[12])), ptok)
    grow(WW, nil, tonumber(ARGV[12]))
  end
end

-- Nobody waits to read or to write: nothing to hand on, no one to wake.
if redis.call('EXISTS', RQ, WW, WQ) == 0 then
  return answer(1)
end
prune()

-- Every reader that waited for this writer holds the lock now, with its own
-- lease, and its lock call is remembered as one that took effect, so that
-- the call's next attempt finds the hold and changes nothing; writers that
-- wait wait for these readers.
local q = redis.call('HGETALL', RQ)
-- The furthest lease given here (ms from now).
local admitted, longest = 0, 0
for i = 1, #q, 2 do
  local rt = q[i]
  local dl, rttl, cid = string.match(q[i + 1], '^(%d+) (%d+) (%S+)$')
  -- A place too far off, or a TTL no Client sends (foreign data, see
  -- lib.lua's too_far), admits nobody: the readers' keys would take that
  -- TTL as their expiry.
  if dl and tonumber(dl) > now and not too_far(tonumber(dl), rttl) and not recall(X, cid) then
    local c, rid, ids = 0, num(hold_id(cid)), ''
    local rec = redis.call('HGET', RC, rt)
    if rec then
      c, rid, ids = read_rec(rec)
    end
    if c then
      local kept, gone = remember_dropping(ids, cid)
      write_rec(rt, c + 1, rid, kept)
      dropped(gone, rid)
      local s = tonumber(redis.call('ZSCORE', R, rt) or 0)
      if now + tonumber(rttl) > s then
        redis.call('ZADD', R, num(now + tonumber(rttl)), rt)
        longest = math.max(longest, tonumber(rttl))
      end
      noted(cid, 1)
      admitted = admitted + 1
    end
  end
end
if #q > 0 then
  redis.call('DEL', RQ)
  if longest > 0 then
    grow(R, RC, longest)
  elseif admitted > 0 then
    -- Readers re-entered with leases that reach no further than they
    -- did: the hash got records, the keys' expiries stand.
    fit(R, RC)
  end
end
-- With no reader waiting, and none left (the owner may keep a read hold: a
-- downgrade), the first queued writer gets the lock.
if admitted == 0 and redis.call('EXISTS', R) == 0 and hand_over(ch, idle) then
  return answer(1)
end
if #q > 0 or redis.call('EXISTS', WW) == 1 then
  redis.call('PUBLISH', ch, '')
end
return answer(1)
