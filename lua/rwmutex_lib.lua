-- rwmutex_lib: definitions shared by rwmutex_lock.lua and rwmutex_unlock.lua,
-- which begin with this file (lua.Source puts it in front). It names the
-- keys, reads the server clock, drops what has expired, and keeps the
-- writers' queue.
--
-- KEYS[1] writer hash, KEYS[2] fence hash, KEYS[3] readers zset, KEYS[4]
-- readers hash, KEYS[5] waiting writers zset, KEYS[6] waiting readers hash,
-- KEYS[7] call ids zset (see lib.lua), KEYS[8] writers' queue zset, KEYS[9]
-- queued writers hash (see rwmutex_lock.lua)

local W, F, R, RC, WW, RQ, X, WQ, WD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
clock()
local now = now_ms

-- Big numbers go to Redis as plain integers, never in Lua's %.14g form
-- (see lib.lua's digits).
local num = digits

-- Leases and places end by server time. A script drops every expired
-- reader (each reader's share expires alone) before it reads the readers,
-- and lapsed writer places before it counts the waiting writers or asks
-- whether any wait; each runs at most once per script. Where a key is
-- found absent there is nothing to drop: a zset (and its companion hash)
-- expires with its furthest deadline (see fit), so one whose entries all
-- lapsed is gone.
local readers_pruned, writers_pruned = false, false

-- The readers zset's two lowest entries with their deadlines
-- ({member, deadline, member, deadline}, fewer when it has fewer; {}
-- when it is absent), as prune_readers found them when none had lapsed:
-- nil when it pruned, or has not run. Only for a script that writes no
-- reader between prune_readers and its use of this.
local readers_low

local function prune_readers()
  if readers_pruned then
    return
  end
  readers_pruned = true
  -- The earliest deadlines first: when none has passed (the common case,
  -- a free name among them) there is nothing to drop, and what was read
  -- tells whether the zset exists, or holds a single reader.
  local low = redis.call('ZRANGE', R, '0', '1', 'WITHSCORES')
  local first = low[2] and tonumber(low[2])
  if not low[2] or (first and first > now) then
    readers_low = low
    return
  end
  local gone = redis.call('ZRANGEBYSCORE', R, '-inf', num(now))
  for _, r in ipairs(gone) do
    redis.call('HDEL', RC, r)
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', R, '-inf', num(now))
  end
end

local function prune_writers()
  if writers_pruned then
    return
  end
  writers_pruned = true
  redis.call('ZREMRANGEBYSCORE', WW, '-inf', num(now))
end

-- Both, for the paths that are not worth telling apart.
local function prune()
  prune_readers()
  prune_writers()
end

-- A zset (and its companion hash) expires with its furthest deadline, so no
-- key outlives the leases or places it records; but never later than the
-- expiry dsync's own writes gave it, so that an entry dsync did not write
-- (foreign data: a deadline years off) never keeps a key alive past that:
-- the name recovers once such a key expires. Every write of an entry's
-- deadline is followed by grow, which makes the key last at least until
-- that deadline; fit, after entries were removed, only ever shortens the
-- key's life, to its furthest deadline left. Reports whether z has any
-- entry left. top, if given, is z's last entry as just read.
local function fit(z, h, top)
  top = top or redis.call('ZRANGE', z, '-1', '-1', 'WITHSCORES')
  if top[2] then
    local d = math.max(tonumber(top[2]) - now, 1)
    local p = redis.call('PTTL', z)
    if p > 0 and p < d then
      d = p
    end
    d = num(d)
    redis.call('PEXPIRE', z, d)
    if h then
      redis.call('PEXPIRE', h, d)
    end
    return true
  elseif h then
    redis.call('DEL', h)
  end
  return false
end

-- After this script gave an entry of z (and of its companion hash h) a
-- deadline ms (a number) from now: z lasts until then at least, and h as
-- long as z. p, if given, is z's PTTL as the script knows it (-1: z was
-- absent before the write, which created it without an expiry).
local function grow(z, h, ms, p)
  p = p or redis.call('PTTL', z)
  if p < ms then
    redis.call('PEXPIRE', z, num(ms))
    p = ms
  end
  if h then
    redis.call('PEXPIRE', h, num(p))
  end
end

-- Calls to remember (see note_all in lib.lua), written once, by out, when
-- the script returns.
local calls = {}
local function noted(cid, code)
  calls[#calls + 1] = cid
  calls[#calls + 1] = code
end
local function out(reply)
  note_all(X, calls, now)
  return reply
end

-- A reader's record in the readers hash: "<reentry count> <hold id> <ids
-- of the calls applied to the hold>". The hold id tells one read hold of an
-- owner from its later ones: an RUnlock names it, so that a late copy of
-- one never ends a later read hold. Returns count, hold id (a string) and
-- ids; nil for a record dsync did not write.
local function read_rec(rec)
  -- write_rec always puts a space after the hold id, also before no ids.
  local cnt, rid, ids = string.match(rec, '^(%d+) (%d+) (.*)$')
  if not cnt then
    return nil
  end
  return tonumber(cnt), rid, ids
end

-- Remembers the call ids gone (space-separated, or nil) that the list of
-- the hold named hold (its fencing token, or a read hold's id) dropped
-- (see lib.lua's remember_dropping): an abandon of one of them finds it
-- in the call ids zset, tagged with the hold.
local function dropped(gone, hold)
  if gone then
    for d in string.gmatch(gone, '%S+') do
      noted(tagged(d, hold), 1)
    end
  end
end

-- The id of a read hold that the lock call cid begins: 52 bits of the
-- call id's SHA-1, plus 1. Call ids are random, so one owner's read holds
-- differ whatever the server clock does (it may stand still, or step back).
local function hold_id(cid)
  return tonumber(string.sub(redis.sha1hex(cid), 1, 13), 16) + 1
end

local function write_rec(tok, cnt, rid, ids)
  redis.call('HSET', RC, tok, string.format('%d %s %s', cnt, rid, ids))
end

-- The next fencing token of a fresh write hold, as a string: max(last + 1,
-- server time in µs), so tokens keep rising even after the fence hash
-- expired; nil, with nothing written, when the counter holds foreign data
-- (see lib.lua's fence_after and set_fence).
local function next_fence(idle)
  local fence = redis.call('HMGET', F, 'n', 'e')
  local f = fence_after(fence[1], now_us)
  if f then
    set_fence(F, f, fence[2], idle)
  end
  return f
end

-- The writers' queue, as sync.Mutex's starvation mode: a writer that has
-- waited past a threshold queues in arrival order (WQ), with its lock call's
-- TTL and id (WD), and newcomer writers queue behind it. A queued writer
-- also has a waiting place (WW), refreshed by each of its attempts; its
-- queue place lives only as long as that place, so a dead writer's place
-- lapses and is dropped here when met.

-- The first queued writer whose place lives, its place deadline and its
-- "<ttl> <call id>"; lapsed places before it are dropped.
local function head()
  for _ = 1, 1000 do
    local h = redis.call('ZRANGE', WQ, '0', '0')[1]
    if not h then
      return nil
    end
    local dl = redis.call('ZSCORE', WW, h)
    local d = redis.call('HGET', WD, h)
    local t = d and string.match(d, '^(%d+) %S+ %S+$')
    if dl and t and tonumber(dl) > now and not too_far(tonumber(dl), t) then
      return h, tonumber(dl), d
    end
    -- A place without data, with data dsync did not write (foreign), or
    -- too far off (see lib.lua's too_far), is dropped whole, its waiting
    -- place too: a live writer takes it again with its next attempt.
    redis.call('ZREM', WW, h)
    redis.call('ZREM', WQ, h)
    redis.call('HDEL', WD, h)
  end
  return nil
end

-- Drops writer w's waiting place and its queue place.
local function unplace(w)
  if redis.call('ZREM', WW, w) == 1 then
    prune_writers()
    fit(WW)
  end
  redis.call('ZREM', WQ, w)
  redis.call('HDEL', WD, w)
end

-- Hands the free lock (no writer, no reader) to the first queued writer:
-- it holds the lock now, with its own TTL, and its lock call is remembered
-- as one that took effect, so that the call's next attempt finds the hold
-- and changes nothing, and the notification (see publish_handover) tells
-- that call, which then owns the lock without another attempt. Reports
-- whether it did (or, when no fencing token can be issued, told the
-- waiters to try again instead, or told a head whose lease is too short
-- for a hand-over to take the lock itself).
local function hand_over(ch, idle)
  prune_writers()
  for _ = 1, 100 do
    local h, _, d = head()
    if not h then
      return false
    end
    local ttl, cid, secret = string.match(d, '^(%d+) (%S+) (%S+)$')
    if ttl and not hands_over(ttl) and not recall(X, cid) then
      -- Its lease is too short to be handed over (see lib.lua's
      -- hands_over): it keeps its place, first in line, and takes the
      -- free lock with its own attempt.
      publish_retry(ch, cid, h, secret)
      return true
    end
    unplace(h)
    -- A call abandoned by its caller must not get the lock.
    if ttl and not recall(X, cid) then
      local f = next_fence(idle)
      if not f then
        -- No token can be issued (foreign data in the counter): hand over
        -- nothing, and let the waiters try again, to be told so.
        redis.call('PUBLISH', ch, '')
        return true
      end
      redis.call('HSET', W, h, '1', ':f', f, ':c', cid, ':p', prune_mark[X] or '')
      redis.call('PEXPIRE', W, ttl)
      noted(cid, 1)
      publish_handover(ch, cid, h, f, secret)
      -- A writer that waits without a queue place (it was not starving
      -- yet when it last tried, and no queue existed) is told to try
      -- again, and then queues: no hand-over would wake it.
      if redis.call('ZCARD', WW) > redis.call('ZCARD', WQ) then
        redis.call('PUBLISH', ch, '')
      end
      return true
    end
  end
  return false
end
