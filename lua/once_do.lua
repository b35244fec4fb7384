-- once_do: report a Once's done mark, or take its run lease, or say how long
-- to wait. A caller that arrives after the Once is done learns it (and the
-- value) in this one round trip.
--
-- KEYS[1] run hash, alive while someone runs f (expires with its lease):
--         't' token of the runner's call, 'w' set once someone waits,
--         'x' tokens of the last calls their callers abandoned
-- KEYS[2] done hash, the done mark (persists, or expires after the period):
--         'v' the value stored by the run that succeeded, 't' its call token
-- ARGV[1] token of this call (every attempt of one call sends the same)
-- ARGV[2] lease TTL (ms)
-- Reply: {4, value} the Once is done;
--        {1, 0} this attempt took the run lease: the caller must run f;
--        {2, 0} the run lease was this call's already (a repeat of the
--        attempt that took it, after a lost reply);
--        {0, ms} another call runs f: wait at most ms before trying again.

local tok, ttl = ARGV[1], ARGV[2]

local v = redis.call('HGET', KEYS[2], 'v')
if v then
  return { 4, v }
end

-- Abandoned calls: the field keeps the last 16 tokens, space-separated, so
-- that a late attempt of any of them is recognised.
local function seen(list, id)
  return list ~= nil and list ~= false and string.find(' ' .. list .. ' ', ' ' .. id .. ' ', 1, true) ~= nil
end

-- A call its caller abandoned must not take the lease when it arrives late.
if seen(redis.call('HGET', KEYS[1], 'x'), tok) then
  return { 0, 1 }
end

local t = redis.call('HGET', KEYS[1], 't')
if t == tok then
  -- A repeat of this very attempt (a retry after a lost reply).
  return { 2, 0 }
end
if t then
  redis.call('HSET', KEYS[1], 'w', 1)
  local p = redis.call('PTTL', KEYS[1])
  if p < 0 then
    -- No expiry: not a run dsync wrote. Wait a lease at most.
    p = tonumber(ttl)
  elseif p < 1 then
    p = 1
  end
  return { 0, p }
end

redis.call('HSET', KEYS[1], 't', tok)
redis.call('PEXPIRE', KEYS[1], ttl)
return { 1, 0 }
