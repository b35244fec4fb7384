-- lib: definitions shared by every script that changes a primitive's
-- state; lua.Source puts this file in front of them (before the
-- primitive's own *_lib.lua), without the definitions a script does not
-- use. It reads no KEYS or ARGV and changes nothing by itself.

-- A hand-over gives a hold to the waiting call cid of holder tok, and tells
-- that waiter on channel ch. The message is "<call id> <sha1(holder)>
-- <fencing token> <proof>", where proof is sha1(secret .. ' ' .. token) and
-- secret is what the waiting call gave the script that queued it (it is
-- kept in the queue data, which no one but the scripts reads). A waiter
-- accepts a hand-over only with that proof, so a PUBLISH by anyone else can
-- wake a waiter but never grant it a hold; the holder digest lets the
-- holder's other waiting calls (one owner in several goroutines) wake and
-- re-enter, without putting the owner token itself on the channel.
--
-- A secret may end in '@' and the id of the waiter's Client (see wait.go):
-- the waiter's holder token is then one that no other Client's calls hold,
-- and the message goes to that Client's own channel of the name, ch ..
-- '@' .. id, instead of ch, so that the other Clients waiting on the name
-- do not receive (and parse) a message that concerns none of their calls.
-- The proof covers the whole secret, '@' and id included.
local function inbox(ch, secret)
  local at = string.find(secret, '@', 1, true)
  if at then
    return ch .. string.sub(secret, at)
  end
  return ch
end

-- Publishes the hand-over of the hold with fencing token f to call cid
-- of holder tok (see above).
local function publish_handover(ch, cid, tok, f, secret)
  ch = inbox(ch, secret)
  redis.call('PUBLISH', ch, cid .. ' ' .. redis.sha1hex(tok) .. ' ' .. f .. ' ' .. redis.sha1hex(secret .. ' ' .. f))
end

-- Tells waiting call cid of holder tok, whose hand-overs prove secret, to
-- try again at once, granting nothing (see wake_holder): a grant it must
-- learn from its own attempt's reply (see semaphore_lib.lua's grant).
local function publish_retry(ch, cid, tok, secret)
  ch = inbox(ch, secret)
  redis.call('PUBLISH', ch, cid .. ' ' .. redis.sha1hex(tok) .. ' 0 -')
end

-- Wakes the other waiting calls of holder tok after call cid, which gave
-- up, dropped the waiting place they share with it (one place per holder:
-- the last call to refresh it is the one a hand-over goes to): "<cid>
-- <sha1(tok)> 0 -" names their holder but grants nothing (no hold has
-- token 0), so they try again at once and queue again, behind later
-- arrivals. On the name's channel ch, which every Client waiting on the
-- name watches.
local function wake_holder(ch, cid, tok)
  redis.call('PUBLISH', ch, cid .. ' ' .. redis.sha1hex(tok) .. ' 0 -')
end

-- How long a waiting call's place lasts (ms, a string): one lease TTL (ttl,
-- a string), and 200 ms at least. A waiter refreshes its place with every
-- attempt, at most every 20 ms, and comes back within half its TTL: a
-- place of a TTL much below 40 ms would lapse between its attempts, and
-- the waiter would never be first in line. A dead waiter with a shorter
-- TTL delays the others by 200 ms at most.
local function place_ms(ttl)
  if tonumber(ttl) < 200 then
    return '200'
  end
  return ttl
end

-- Whether a release hands its hold to a waiting call whose lease TTL is
-- ttl (ms, a string). A hold handed over lasts that TTL from the release,
-- and its waiter must learn of it in time: from the notification, or, once
-- it has waited a TTL, from an attempt made after it, which may come
-- minRetry (20 ms) after its last one. A hold much shorter than that ends
-- before its waiter learns of it when the waiter is slow to run, and the
-- call starts again at the back of the queue, each time: it would starve.
-- A release does not hand a hold shorter than the shortest place (200 ms,
-- see place_ms) to its waiter: it leaves the waiter first in line and tells
-- it to try again (see publish_retry); the waiter's own attempt takes the
-- free hold, and until it does (or its place lapses, 200 ms after its last
-- attempt at most) no one else takes it.
local function hands_over(ttl)
  return tonumber(ttl) >= 200
end

-- x as a plain decimal string (Lua's tostring would print 1.7e+15).
-- Every number the scripts write is an integer below 2^53, which '%d'
-- prints several times faster than '%.0f' (about 0.5 against 2 µs); one
-- that is not (foreign data, a NaN) still goes through '%.0f', which
-- rounds it as before.
local function digits(x)
  if x == math.floor(x) and x > -9e18 and x < 9e18 then
    return string.format('%d', x)
  end
  return string.format('%.0f', x)
end

-- The fencing token that follows last (a fence hash's 'n': a string, or
-- false or nil when there is none) at server time now_us (µs): the larger
-- of last + 1 and now_us, as a string (and as a number), so that tokens keep rising across
-- the hash's expiry and track server time. It is nil when that is 2^53 or
-- more, or not a number: Lua numbers stop counting by one at 2^53 (a
-- counter there would hand out one token twice), so only foreign data in
-- 'n' gets there, and the caller reports it (reply code 3, ErrCorrupt)
-- without writing anything. Garbage that is no number counts as no counter.
local function fence_after(last, now_us)
  local f = math.max((tonumber(last) or 0) + 1, now_us)
  if f ~= f or f >= 9007199254740992 then
    return nil
  end
  local s = digits(f)
  if f ~= math.floor(f) then
    -- Only from foreign data in 'n': the number as the string has it.
    f = tonumber(s)
  end
  return s, f
end

-- A read of a key that may hold another program's data, of another type:
-- its reply, or nil where the key is of another type (Redis's WRONGTYPE
-- error). A renewal script reads the keys of many holds of one Client in
-- one call; with redis.call, one such key would fail the whole call, and
-- every hold in it would go unrenewed until lost. Only for reads whose
-- caller treats nil as "not held".
local function peek(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    return nil
  end
  return r
end

-- Sets key's expiry to ttl ms unless it already lasts longer: a re-entry
-- or a caller with a shorter TTL never moves a hold's expiry earlier.
local function extend_key(key, ttl)
  if redis.call('PTTL', key) < tonumber(ttl) then
    redis.call('PEXPIRE', key, ttl)
  end
end

-- The reply {code, fencing token f} of a grant (code 1 or 2) of a hold
-- whose expiry the call may have left as it was (a re-entry or join under
-- a lease not to be extended: FixedLease, MaxHold), with the ms the hold
-- has left, left, at least 1: the caller's lease, if it starts one, must
-- not outlast the hold in Redis (a Client of the same owner may have
-- taken it long before).
local function granted_left(code, f, left)
  return { code, f, math.max(math.floor(left), 1) }
end

-- Server time, read at most once per script, here and nowhere else: a
-- script calls clock() before it uses now_us or now_ms.
local now_us, now_ms
local function clock()
  if not now_us then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = math.floor(now_us / 1000)
  end
end

-- Queues member at the tail of the queue zset key (score: arrival time,
-- µs), unless it is queued already (its place kept): one past the tail's
-- score when that is not below the server's time, so that arrival order
-- holds also when the server's clock steps back between two arrivals
-- (scored by the clock alone, the later one would be served first). A
-- tail no arrival could have (foreign data: inf, or 2^53 and more, where
-- one past it is itself) is passed over: copied, it would tie every later
-- arrival, served then by member order, not arrival.
local function arrive(key, member)
  if redis.call('ZSCORE', key, member) then
    return
  end
  clock()
  local a = now_us
  local tail = tonumber(redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')[2])
  if tail and tail >= a and tail < 9007199254740992 then
    a = tail + 1
  end
  redis.call('ZADD', key, digits(a), member)
end

-- Late copies of an acquiring attempt (see clock.go). Each attempt of a
-- lock, acquire, Do or Reset script carries, as its last argument (the
-- bound's ARGV is named in each script), the server time
-- (ms) after which it takes nothing: when it was sent, as its Client
-- estimates the server's clock, plus 20 s. stale(bound) says that this
-- copy arrived after its bound, or that the bound lies more than VALID_MS
-- ahead (the Client's estimate is off, or the argument is no number): the
-- script then answers {6, server time ms} and changes nothing, and the
-- Client corrects its estimate and sends the attempt again. Every attempt
-- of a call is sent before the call takes effect or is abandoned, and
-- the call's id is remembered REPLAY_MS from then; an attempt's bound is
-- less than VALID_MS after its sending once the Client's estimate is
-- right: a copy that arrives after the id is forgotten takes nothing.
local VALID_MS = 40000
local function stale(bound)
  clock()
  local b = tonumber(bound)
  return not b or b < now_ms or b > now_ms + VALID_MS
end

-- The longest lease TTL a Client sends (ms; dsync.MaxTTL, 24 h).
local MAX_TTL_MS = 86400000

-- Whether a waiting place that lapses at dl (server ms, a number), of a
-- waiter whose TTL is ttl (ms, a string), lasts longer than any place that
-- waiter takes (place_ms(ttl) from its last attempt), by more than
-- VALID_MS, allowed for a server clock that stepped back since; or
-- whether ttl is no TTL a Client sends (below 1 ms, above MAX_TTL_MS).
-- Only foreign data does either: every waiter's attempt keeps the queue's
-- keys alive, and such a place would stay first in line for good (or be
-- handed a hold for its TTL, which the hold's key would take as its
-- expiry), so it is dropped as garbage is.
local function too_far(dl, ttl)
  local t = tonumber(ttl)
  if not t or t < 1 or t > MAX_TTL_MS then
    return true
  end
  clock()
  return dl > now_ms + tonumber(place_ms(ttl)) + VALID_MS
end

-- A refused attempt's reply {0, ms, server time µs}: try again after at
-- most ms. The time lets the waiter tell a hand-over granted before this
-- refusal (a fencing token is at least the server's time in µs at its
-- grant, see fence_after), which the refusal shows lost, from one granted
-- after it (see engine.go's grantedBefore).
local function refusal(ms)
  clock()
  return { 0, ms, now_us }
end

-- The fence hash of a name (the fencing counter) outlives its holds with
-- an idle expiry: 'n' the last fencing token, 'e' the server time (ms) at
-- which the hash expires as the scripts last set it, so that they need not
-- read its expiry. Writes the token n (a string) to the fence hash key, whose
-- 'e' was read as e in this script, and keeps the hash alive for idle ms
-- after this use: its expiry (and 'e') is rewritten only once less than
-- half of that is left, so that most calls write 'n' alone. A hash without
-- 'e' (created by someone else, or foreign data there) gets both. Returns
-- the hash's 'e' after the write.
local function set_fence(key, n, e, idle)
  clock()
  local ms = tonumber(idle)
  local left = (tonumber(e) or 0) - now_ms
  -- An 'e' further off than a whole idle period is none the scripts
  -- wrote (foreign data, a hash kept without expiry): rewritten too.
  if left >= ms / 2 and left <= ms then
    redis.call('HSET', key, 'n', n)
    return e
  end
  e = digits(now_ms + ms)
  redis.call('HSET', key, 'n', n, 'e', e)
  redis.call('PEXPIRE', key, digits(ms))
  return e
end

-- Call ids. go-redis sends a script again after a read timeout, and the
-- first copy may still arrive later, after other calls; a cancelled call's
-- attempt may arrive after its caller gave up. So every call that changed
-- something, was abandoned, or was refused for good is remembered for
-- REPLAY_MS (the replay window) in a zset of the primitive: member the call
-- id, score (forget-after ms) * 4 + a code saying what the call did. A
-- repeat within the window answers from the code and changes nothing,
-- however many calls came in between. Memory is bounded by time, not by
-- count: old ids are pruned, and the zset expires with its newest id.
local REPLAY_MS = 60000
-- REPLAY_MS as a command argument. A number given to redis.call is
-- printed by the server with '%.17g', about 1.5 µs: the scripts hand it
-- strings (a literal, an ARGV, digits()) wherever a call is on a hot path.
local REPLAY_ARG = '60000'

-- Old ids are pruned at most every PRUNE_MS: the member PRUNE_MARK (call
-- ids never contain ':') has the score (next prune's time ms) * 4, and is
-- read with the id that recall looks up, in the same command. An id is so
-- kept up to PRUNE_MS past its window, still within its key's expiry.
local PRUNE_MS, PRUNE_MARK = 5000, ':p'

-- Per key: when its ids are to be pruned next (ms), as this script last
-- read or set it; false when unknown (no marker, or foreign data there).
-- prune_mark holds the marker's score as the zset has it (a string).
local prune_at, prune_mark = {}, {}

-- The code remembered for id in the zset key, or nil.
local function recall(key, id)
  local s = redis.call('ZMSCORE', key, id, PRUNE_MARK)
  prune_at[key] = s[2] and math.floor((tonumber(s[2]) or 0) / 4)
  prune_mark[key] = s[2]
  if not s[1] then
    return nil
  end
  return tonumber(s[1]) % 4
end

-- Takes mark, a copy of key's prune marker score that an earlier script
-- read or set, as this script's knowledge of when key's ids are to be
-- pruned next, so that a script that need not recall from key need not
-- prune it on every call either (a Mutex hold keeps the marker its Lock
-- left, for its Unlock). A stale copy only puts a prune off until the next
-- script that recalls from key; one that is no marker, or is due or too
-- far off at now_ms, is not taken.
local function cached_mark(key, mark, now_ms)
  local due = mark and tonumber(mark)
  if not due then
    return
  end
  due = math.floor(due / 4)
  if due > now_ms and due <= now_ms + PRUNE_MS then
    prune_at[key], prune_mark[key] = due, mark
  end
end

-- A prune removes PRUNE_MAX old ids at the most, so that no script holds
-- the server for long: a name taken thousands of times a second gathers
-- tens of thousands of ids between two prunes, and removing 50,000 in one
-- command took 6.3 ms in BenchmarkPruneBacklog (more when their scores
-- are spread: 70,000 took 26 ms), in which the server serves no client. When more are old, the marker is left due, and the
-- next script that notes into the key prunes the next ones.
local PRUNE_MAX = 500

-- Prunes key's old ids when a prune is due (or not known not to be: this
-- script did not recall from key), PRUNE_MAX at the most. Returns the ZADD
-- arguments that move the prune marker on, or nil when no prune was due.
local function prune_ids(key, now_ms)
  local due = prune_at[key]
  -- A marker from foreign data, or from a clock that stepped back, can be
  -- too far off: that counts as due too.
  if due and due > now_ms and due <= now_ms + PRUNE_MS then
    return nil
  end
  -- Old ids are the zset's lowest (a score is the id's forget-after time;
  -- the marker's lies ahead, or is old too): ranks 0 to old - 1.
  local next_ms = now_ms + PRUNE_MS
  local old = redis.call('ZCOUNT', key, '-inf', string.format('(%.0f', now_ms * 4))
  if old > 0 then
    redis.call('ZREMRANGEBYRANK', key, '0', digits(math.min(old, PRUNE_MAX) - 1))
    if old > PRUNE_MAX then
      -- The rest in the next script: the marker is due at once.
      next_ms = now_ms
    end
  end
  local mark = digits(next_ms * 4)
  -- This script prunes key once, whatever the marker says.
  prune_at[key], prune_mark[key] = now_ms + PRUNE_MS, mark
  return { mark, PRUNE_MARK }
end

-- Remembers the calls in list ({id, code, id, code, ...}, codes 0 to 3)
-- for the replay window from now_ms: one ZADD (per 500 ids) and one
-- PEXPIRE, whatever the number of ids, and a prune of old ids when one is
-- due.
local function note_all(key, list, now_ms)
  if #list == 0 then
    return
  end
  local args = prune_ids(key, now_ms) or {}
  local base = (now_ms + REPLAY_MS) * 4
  for i = 1, #list, 2 do
    args[#args + 1] = digits(base + list[i + 1])
    args[#args + 1] = list[i]
    if #args >= 1000 or i + 1 >= #list then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  -- Every id in key is forgotten by now + REPLAY_MS at the latest (pruned
  -- by PRUNE_MS later), so the key need not live longer (nor can it
  -- already).
  redis.call('PEXPIRE', key, REPLAY_ARG)
end

-- Remembers id with code (0 to 3) for the replay window from now_ms: what
-- note_all(key, {id, code}, now_ms) does, with no list to build on the
-- hot path.
local function note(key, id, now_ms, code)
  local score = digits((now_ms + REPLAY_MS) * 4 + code)
  local mark = prune_ids(key, now_ms)
  if mark then
    redis.call('ZADD', key, mark[1], mark[2], score, id)
  else
    redis.call('ZADD', key, score, id)
  end
  redis.call('PEXPIRE', key, REPLAY_ARG)
end

-- The calls applied to a hold (taken, re-entered, handed over): a field
-- holds the ids of the last few, space-separated, latest last. They are not
-- for recognising repeats (recall does that, for the whole replay window):
-- an abandon (a call its caller gave up on, reply lost) undoes its call's
-- effect only if the call is among them, and only once, since an undone id
-- leaves the list. An abandon runs as soon as its call failed, but many
-- calls of one holder at once can push its id out of the list first: the
-- ids pushed out are kept in the call ids zset, tagged with the hold (see
-- remember_dropping), where the abandon finds them, and undoes one only
-- if the zset says it took effect and was not abandoned since.

-- list: the remembered ids, or nil/false when there are none.
local function seen(list, id)
  return list ~= nil and list ~= false and string.find(' ' .. list .. ' ', ' ' .. id .. ' ', 1, true) ~= nil
end

-- list with id added, keeping the last keep ids (default 16), and the ids
-- dropped from it, space-separated (nil when none). The ids dropped are
-- skipped over, not cut off one by one, so that a list of foreign data
-- costs time in proportion to its length, not its square. A hold whose
-- list may drop ids its caller can still abandon (many calls of one holder
-- at once) keeps those in the call ids zset as '<id>><hold>' (see tagged),
-- where an abandon that does not find its id in the list looks for it.
local function remember_dropping(list, id, keep)
  if not list or list == '' then
    return id, nil
  end
  local l = list .. ' ' .. id
  local _, n = string.gsub(l, ' ', ' ')
  local at = 1
  for _ = keep or 16, n do
    at = string.find(l, ' ', at, true) + 1
  end
  if at == 1 then
    return l, nil
  end
  return string.sub(l, at), string.sub(l, 1, at - 2)
end

-- remember_dropping's list alone.
local function remember(list, id, keep)
  return (remember_dropping(list, id, keep))
end

-- The call ids zset member that says the call id took effect on the hold
-- named hold (its fencing token) and was dropped from the hold's list.
-- Call ids never contain '>'.
local function tagged(id, hold)
  return id .. '>' .. hold
end

-- The hold (its fencing token, a string) that the release id, which
-- named none, ended, as the release noted it with its own id:
-- tagged(id, token), with id's score, so that a repeat of the release
-- answers with it as the first run did. nil if it noted none. Looked for
-- among the ids noted in the same ms, 1000 at most (foreign data).
local function ended_by(key, id)
  local s = redis.call('ZSCORE', key, id)
  local p = tagged(id, '')
  for _, m in ipairs(s and redis.call('ZRANGEBYSCORE', key, s, s, 'LIMIT', '0', '1000') or {}) do
    if string.sub(m, 1, #p) == p then
      return string.sub(m, #p + 1)
    end
  end
  return nil
end

-- A repeat of a release (a copy of it, or the caller's repeat after a
-- lost reply, under the same id) that recall found with code, and, for a
-- release that named no hold and ended one, that hold's token ended (as
-- ended_by found it): the id is remembered again for the replay window
-- from now, so that the window runs from the last copy that ran, not from
-- the first. A release whose first run's reply was lost returns when a
-- repeat of it answers, maybe seconds later: remembered from the first
-- run only, a copy of it that arrived less than a minute after the call
-- returned, once the id was forgotten, would end a level again (the
-- owner's last one, which it still counts). A code that is no code (foreign
-- data in the zset) is left as it is.
local function recall_again(key, id, code, ended)
  if not (code == 0 or code == 1 or code == 2 or code == 3) then
    return
  end
  clock()
  if ended then
    -- ended_by finds the token by the id's score: both move together.
    note_all(key, { id, code, tagged(id, ended), code }, now_ms)
  else
    note(key, id, now_ms, code)
  end
end

-- Whether the call id took effect on the hold named hold (its fencing
-- token, or a read hold's id; false or nil for none) whose list of applied
-- calls is list: the id is in the list, or was pushed out of it by later
-- calls of the holder and kept in the call ids zset key, tagged with the
-- hold. A repeat of a call that took effect answers with the holder's hold
-- only if the call took effect on that hold: the hold it took may have
-- ended, and the holder may hold afresh, with nothing of the call in it.
local function applied(key, list, id, hold)
  if seen(list, id) then
    return true
  end
  return hold ~= nil and hold ~= false and redis.call('ZSCORE', key, tagged(id, hold)) ~= false
end

-- list without id.
local function forget(list, id)
  if not list then
    return ''
  end
  local l = ' ' .. list .. ' '
  local i = string.find(l, ' ' .. id .. ' ', 1, true)
  if not i then
    return list
  end
  l = string.sub(l, 1, i) .. string.sub(l, i + #id + 2)
  return string.sub(l, 2, -2)
end
