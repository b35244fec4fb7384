-- semaphore_lib: definitions shared by semaphore_acquire, semaphore_release
-- and semaphore_abandon; lua/semaphore.go puts this text in front of each of
-- them. It reads no ARGV and changes nothing by itself.
--
-- The keys of one semaphore, all under its {name} hash tag:
-- KEYS[1] state hash: ':size' the size in force, ':used' permits held in all
--         (kept equal to the sum of the holdings), <token> -> permits held by
--         that holder, ':f:'<token> -> fencing token of that holding,
--         ':c:'<token> -> ids of the latest Acquire calls applied to that
--         holding (see lib.lua: what an abandon may undo), ':d:'<token>
--         set once a release that named that holding lowered it or was
--         refused (see semaphore_release.lua), ':p' the call ids' prune
--         marker as the last Acquire that took permits found it, ':q' set
--         once a call queued (cleared only with the hash: while it is
--         unset, nobody is queued). Owner tokens never begin with ':', so
--         the fields cannot clash.
-- KEYS[2] fence hash (outlives holdings, idle expiry): 'n' last fencing token,
--         'e' when the hash expires (see lib.lua's set_fence); shared with
--         the Mutex of the name
-- KEYS[3] holders zset: <token> -> lease deadline (server ms)
-- KEYS[4] queue zset: Acquire call id -> arrival (server µs, increasing)
-- KEYS[5] queue data hash: call id -> "<place deadline ms> [f]<ttl ms> <n>
--         <secret> <token>"
-- KEYS[6] call ids zset (see lib.lua): an Acquire call 1 took or was
--         granted permits, 2 abandoned or refused for good (a try refused,
--         a size mismatch); a release 1 ended its holding, 2 lowered it, 0
--         found nothing held, 3 refused (n more than held, a size mismatch).
--         A repeat within the replay window changes nothing.
--
-- Invariants kept by every script: a holder whose deadline passed is pruned
-- before anything else is decided, so its permits come back by themselves;
-- waiters are served strictly in arrival order (the head is served when it
-- fits, nobody passes it); every key carries an expiry at least as late as
-- the deadlines stored in it.

clock()

-- How many Acquire call ids a holding remembers for an abandon in its own
-- list; ids that more calls of the holder push out of it are kept in the
-- call ids zset instead (see take and lib.lua's remember_dropping).
local RECENT = 32

-- Numbers are formatted by hand: Lua would print 1.7e+15 (see lib.lua's
-- digits).
local fmt = digits

-- Calls to remember (see note_all in lib.lua), written once, by out, when
-- the script returns.
local calls = {}
local function noted(cid, code)
  calls[#calls + 1] = cid
  calls[#calls + 1] = code
end
local function out(reply)
  note_all(KEYS[6], calls, now_ms)
  return reply
end

-- Expiries (PTTL, ms) known in this script, so that a key's expiry is read
-- at most once and not written twice. A key whose fields may have been
-- removed is forgotten here (it may be gone, and written anew after).
local known = {}

-- What this script knows of the state hash: ':size' (nil when unset),
-- ':used', and per holder token {n = permits, f = fencing token, c = call
-- ids}, and queued (':q'); with marks (set by the release before it
-- reads), also the first holder's d (':d:'<token>) and the hash's mark
-- (':p'). It is read once, by the first hold() (after prune), and kept
-- up to date by every write below, so that no field is read twice.
local in_force, used, queued, marks, mark
local hashed -- the state hash had ':size' or ':used' when read
local held = {}
local wiped = false -- tidy deleted the keys in this script
-- prune left holdings whose lease ran out (more than it drops at once)
local behind = false

-- A count of the state hash as read (false when unset: 0), which dsync
-- writes as digits below 2^53, not below least (1 for a size). Anything
-- else is foreign data, and the script fails (ErrCorrupt) rather than
-- count with it: read as a number, "nan" or "-5" would let callers past
-- the size, or keep every waiter waiting, and the state hash alive, for
-- good.
local function count(s, least)
  local v = s and string.match(s, '^%d+$') and tonumber(s)
  if s and not (v and v >= (least or 0) and v < 9007199254740992) then
    error('dsync: foreign data in the state of a semaphore')
  end
  return v or 0
end

-- A holding of tok (h, n > 0) whose lease ran out, left by prune for a
-- later script (more than it drops at once), is over all the same: taken
-- again, it is a fresh one with a new fencing token (kept, its token would
-- come back after later holdings' larger ones). Returns the holding as it
-- is now.
local function lapse(tok, h)
  if behind and h.n > 0 and (tonumber(redis.call('ZSCORE', KEYS[3], tok)) or 0) <= now_ms then
    redis.call('HDEL', KEYS[1], tok, ':f:' .. tok, ':c:' .. tok, ':d:' .. tok)
    redis.call('ZREM', KEYS[3], tok)
    redis.call('HINCRBY', KEYS[1], ':used', -h.n)
    used = used - h.n
    known[KEYS[1]], known[KEYS[3]] = nil, nil
    h = { n = 0 }
  end
  return h
end

-- tok's holding, read with ':size' and ':used' on the first call (before
-- prune or after it: prune keeps what was read up to date).
local function hold(tok)
  local h = held[tok]
  if h then
    return h
  end
  if wiped then
    h = { n = 0 }
  elseif used == nil then
    local r
    if marks then
      r = redis.call('HMGET', KEYS[1], tok, ':f:' .. tok, ':c:' .. tok, ':size', ':used', ':q', ':d:' .. tok, ':p')
    else
      r = redis.call('HMGET', KEYS[1], tok, ':f:' .. tok, ':c:' .. tok, ':size', ':used', ':q')
    end
    h = { n = count(r[1]), f = r[2] or nil, c = r[3] or nil, d = r[7] or nil }
    in_force, used = r[4] and count(r[4], 1) or nil, count(r[5])
    hashed = r[4] or r[5]
    queued, mark = r[6] or nil, r[8] or nil
  else
    local r = redis.call('HMGET', KEYS[1], tok, ':f:' .. tok, ':c:' .. tok)
    h = { n = count(r[1]), f = r[2] or nil, c = r[3] or nil }
  end
  h = lapse(tok, h)
  held[tok] = h
  return h
end

local function pttl(key)
  if known[key] == nil then
    known[key] = redis.call('PTTL', key)
  end
  return known[key]
end

local function extend(key, ttl)
  if pttl(key) < tonumber(ttl) then
    redis.call('PEXPIRE', key, ttl)
    known[key] = tonumber(ttl)
  end
end

-- Drop the holdings whose lease ran out, giving their permits back, once
-- per script. Runs before anything is decided on the state hash's counts;
-- it may run after the first hold() read them (which it then keeps up to
-- date), so that a script that finds no permits counted need not run it:
-- with ':used' 0 no holding has permits to give back.
local pruned = false
local function prune()
  if pruned then
    return
  end
  pruned = true
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', digits(now_ms), 'LIMIT', '0', '100')
  for _, h in ipairs(gone) do
    -- Holder tokens never begin with ':'. Such a member is foreign data:
    -- it goes alone, or it would take ':used' (say) with it.
    local c = 0
    if string.sub(h, 1, 1) ~= ':' then
      c = tonumber(redis.call('HGET', KEYS[1], h) or '0') or 0
      redis.call('HDEL', KEYS[1], h, ':f:' .. h, ':c:' .. h, ':d:' .. h)
      if held[h] then
        held[h] = { n = 0 }
      end
    end
    redis.call('ZREM', KEYS[3], h)
    if c > 0 then
      redis.call('HINCRBY', KEYS[1], ':used', -c)
      if used then
        used, hashed = used - c, true
      end
    end
  end
  if #gone > 0 then
    known[KEYS[1]], known[KEYS[3]] = nil, nil
    -- ':used' as the state hash has it now, read before: what count
    -- would say of it if read now.
    if used and used < 0 then
      error('dsync: foreign data in the state of a semaphore')
    end
  end
  behind = #gone == 100
  if behind then
    for t, h in pairs(held) do
      held[t] = lapse(t, h)
    end
  end
end

-- The fence hash's 'n' (the last fencing token) and 'e' (when it
-- expires, see lib.lua's set_fence), once read or written.
local last, last_e

-- Next fencing token = max(last + 1, server time in µs), so tokens keep
-- rising even after the fence hash expired. Returns it as a string, or
-- nil, writing nothing, when 'n' holds foreign data (lib.lua's
-- fence_after).
local function fence(idle)
  if not last then
    local r = redis.call('HMGET', KEYS[2], 'n', 'e')
    last, last_e = r[1], r[2]
  end
  local f = fence_after(last, now_us)
  if not f then
    return nil
  end
  last = f
  last_e = set_fence(KEYS[2], last, last_e, idle)
  return last
end

-- Give n permits to tok for the call id: a fresh holding gets a new fencing
-- token, a holder that holds already adds to its count and keeps its token.
-- The lease deadline never moves back (another process of the same owner
-- may have a longer TTL), and with fixed it stays where it is for a
-- holding that is not fresh (a lease that is not to be extended: the
-- holding lasts as its holder's Lease reports). With sz, ':size' is set
-- to it too. The call is
-- remembered as one that took effect. Returns the fencing token (a
-- string), or nil, changing nothing, when there is none to give: 'n' or
-- the holding's token field holds foreign data (or is gone).
local function take(tok, n, ttl, id, idle, sz, fixed)
  local h = hold(tok)
  local fresh = h.n == 0
  if fresh then
    h.f = fence(idle)
    h.c = nil
  end
  if not h.f then
    return nil
  end
  h.n = h.n + tonumber(n)
  local gone
  h.c, gone = remember_dropping(h.c, id, RECENT)
  noted(id, 1)
  if gone then
    -- More calls of the holder than the list keeps: an abandon of a call
    -- dropped from it finds it in the call ids zset (see
    -- semaphore_abandon.lua).
    for d in string.gmatch(gone, '%S+') do
      noted(tagged(d, h.f), 1)
    end
  end
  used = used + tonumber(n)
  -- The holder's deadline in the holders zset, first (a holders zset of
  -- another type fails the script before the state hash is written),
  -- read unless this script wrote it, tidy deleted the zset or the
  -- holding is fresh: a deadline of tok there without permits in the
  -- state hash is of a holding that ended (its keys removed or expired),
  -- and the fresh one does not keep it.
  local d = now_ms + tonumber(ttl)
  local cur = h.dl or (not wiped and not fresh and tonumber(redis.call('ZSCORE', KEYS[3], tok)))
  if not cur or (cur < d and not fixed) then
    redis.call('ZADD', KEYS[3], fmt(d), tok)
    cur = d
  end
  h.dl = cur
  -- The prune marker as this script found it goes with the holding's
  -- fields, for the release (see semaphore_release.lua): '' when none.
  local pm = prune_mark[KEYS[6]] or ''
  if sz then
    in_force = tonumber(sz)
    redis.call('HSET', KEYS[1], tok, fmt(h.n), ':f:' .. tok, h.f, ':c:' .. tok, h.c, ':used', fmt(used), ':p', pm, ':size', sz)
  else
    redis.call('HSET', KEYS[1], tok, fmt(h.n), ':f:' .. tok, h.f, ':c:' .. tok, h.c, ':used', fmt(used), ':p', pm)
  end
  extend(KEYS[1], ttl)
  extend(KEYS[3], ttl)
  return h.f
end

-- End tok's holding of c permits.
local function finish(tok, c)
  redis.call('HDEL', KEYS[1], tok, ':f:' .. tok, ':c:' .. tok, ':d:' .. tok)
  redis.call('ZREM', KEYS[3], tok)
  redis.call('HINCRBY', KEYS[1], ':used', -c)
  used = used - c
  held[tok] = { n = 0 }
  known[KEYS[3]] = nil
end

local function unqueue(id)
  redis.call('ZREM', KEYS[4], id)
  redis.call('HDEL', KEYS[5], id)
  known[KEYS[4]], known[KEYS[5]] = nil, nil
end

-- Serve the queue in arrival order: hand permits to the head while it fits,
-- dropping heads whose place lapsed, and tell each served waiter on the
-- channel ("<call id> <fence>"): it holds them now, without another round
-- trip. Stops at the first live head that does not fit, so a large request
-- is never passed by smaller ones, and at one that fits but is not self
-- and whose lease is too short to be handed permits (it is told to try
-- again). Returns the fencing token if the waiter
-- with call id self was served (it learns from the reply instead; false if
-- it fit but no token could be issued), the head the queue is left with
-- (nil when empty) and, when read, that head's data. first, if given, is
-- the head as just read.
local function grant(ch, idle, self, first)
  local served, h, d
  for i = 1, 101 do
    d = nil
    if i == 1 and first then
      h = first
    else
      h = redis.call('ZRANGE', KEYS[4], '0', '0')[1]
    end
    if not h or i == 101 then
      break
    end
    d = redis.call('HGET', KEYS[5], h)
    local dl, fixed, ttl, n, secret, tok
    if d then
      dl, fixed, ttl, n, secret, tok = string.match(d, '^(%d+) (f?)(%d+) (%d+) (%S+) (.+)$')
    end
    -- Garbage, a lapsed place and one too far off (see lib.lua's
    -- too_far) are dropped; so is a holder token that begins with ':'
    -- (no owner token does: it would name a field of the state hash).
    if not dl or tonumber(dl) <= now_ms or too_far(tonumber(dl), ttl) or string.sub(tok, 1, 1) == ':' then
      unqueue(h)
    elseif used + tonumber(n) > (in_force or 0) then
      break
    elseif h ~= self and not hands_over(ttl) then
      -- Its lease is too short to be handed over (see lib.lua's
      -- hands_over): it stays first in line, and its own attempt takes
      -- the permits.
      publish_retry(ch, h, tok, secret)
      break
    else
      -- A join under a lease not to be extended leaves the holding's
      -- deadline as it was: the waiter must learn how long the holding
      -- has left (its process may not be the one that took it), which a
      -- hand-over message does not tell. It is told to try again, and
      -- its attempt, a repeat of the call, answers with the grant.
      local join = fixed == 'f' and hold(tok).n > 0
      local f = take(tok, n, ttl, h, idle, nil, join)
      if not f then
        -- No fencing token (foreign data): serve nobody; each waiter's
        -- own attempt is told so (served is false for self), the head's
        -- at once.
        if h == self then
          served = false
        else
          redis.call('PUBLISH', ch, '')
        end
        break
      end
      unqueue(h)
      if h == self then
        served = f
      elseif join then
        publish_retry(ch, h, tok, secret)
      else
        publish_handover(ch, h, tok, f, secret)
      end
    end
  end
  return served, h or nil, d or nil
end

-- Whether the state hash, the holders zset, the queue and its data hash
-- are all absent, looked up once (one EXISTS) and remembered: only for a
-- script that writes none of them before it asks again (a false answer
-- may go stale harmlessly: tidy then deletes keys already gone).
local absent
local function all_absent()
  if absent == nil then
    absent = redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[4], KEYS[5]) == 0
  end
  return absent
end

-- Delete the semaphore's keys when nothing is held or queued (head is the
-- queue's head, nil when empty), so that a new size may take over and
-- nothing is left behind. The fence hash stays.
local function tidy(head)
  if used <= 0 and not head then
    if in_force or hashed or not all_absent() then
      redis.call('DEL', KEYS[1], KEYS[3], KEYS[4], KEYS[5])
    end
    for i = 3, 5 do
      known[KEYS[i]] = -2
    end
    known[KEYS[1]] = -2
    in_force, used, held, wiped, queued = nil, 0, {}, true, nil
  end
end

-- How long a waiter may sleep before trying again: until the first lease
-- or the place of the head before it can lapse, at most cap ms. head and
-- hd are the queue's head and its data as grant left them (the call self
-- queued behind); nil head: self is first.
local function waitms(self, cap, head, hd)
  local w = tonumber(cap)
  local first = redis.call('ZRANGE', KEYS[3], '0', '0', 'WITHSCORES')
  if first[2] then
    w = math.min(w, tonumber(first[2]) - now_ms)
  end
  if head and head ~= self then
    local d = hd or redis.call('HGET', KEYS[5], head)
    if d then
      w = math.min(w, tonumber(string.match(d, '^(%d+)')) - now_ms)
    end
  end
  return math.max(w, 1)
end
