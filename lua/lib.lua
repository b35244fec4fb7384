-- lib: definitions shared by every script that changes a primitive's
-- state; lua.Source puts this file in front of them (before the
-- primitive's own *_lib.lua). It reads no KEYS or ARGV and changes nothing
-- by itself.

-- A hand-over gives a hold to the waiting call cid of holder tok, and tells
-- that waiter on channel ch. The message is "<call id> <sha1(holder)>
-- <fencing token> <proof>", where proof is sha1(secret .. ' ' .. token) and
-- secret is what the waiting call gave the script that queued it (it is
-- kept in the queue data, which no one but the scripts reads). A waiter
-- accepts a hand-over only with that proof, so a PUBLISH by anyone else can
-- wake a waiter but never grant it a hold; the holder digest lets the
-- holder's other waiting calls (one owner in several goroutines) wake and
-- re-enter, without putting the owner token itself on the channel.
local function publish_handover(ch, cid, tok, f, secret)
  redis.call('PUBLISH', ch, cid .. ' ' .. redis.sha1hex(tok) .. ' ' .. f .. ' ' .. redis.sha1hex(secret .. ' ' .. f))
end

-- The fencing token that follows last (a fence hash's 'n': a string, or
-- false or nil when there is none) at server time now_us (µs): the larger
-- of last + 1 and now_us, as a string, so that tokens keep rising across
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
  return string.format('%.0f', f)
end

-- Sets key's expiry to ttl ms unless it already lasts longer: a re-entry
-- or a caller with a shorter TTL never moves a hold's expiry earlier.
local function extend_key(key, ttl)
  if redis.call('PTTL', key) < tonumber(ttl) then
    redis.call('PEXPIRE', key, ttl)
  end
end

-- Call ids. go-redis sends a script again after a read timeout, and the
-- first copy may still arrive later, after other calls; a cancelled call's
-- attempt may arrive after its caller gave up. So every call that changed
-- something, or was abandoned, is remembered for REPLAY_MS (the replay
-- window) in a zset of the primitive: member the call id, score
-- (forget-after ms) * 4 + a code saying what the call did. A repeat within
-- the window answers from the code and changes nothing. Memory is bounded by
-- time, not by count, and old ids are pruned by every write.
local REPLAY_MS = 60000

-- The code remembered for id in the zset key, or nil.
local function recall(key, id)
  local s = redis.call('ZSCORE', key, id)
  if not s then
    return nil
  end
  return tonumber(s) % 4
end

-- Remembers id with code (0 to 3) for the replay window from now_ms.
local function note(key, id, now_ms, code)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('(%.0f', now_ms * 4))
  redis.call('ZADD', key, string.format('%.0f', (now_ms + REPLAY_MS) * 4 + code), id)
  extend_key(key, REPLAY_MS)
end
