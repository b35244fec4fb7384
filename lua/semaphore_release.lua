-- semaphore_release: give back n permits of a holder; permits freed go to
-- the queue head(s) that fit, in arrival order. Preceded by
-- semaphore_lib.lua, which describes KEYS[1..5].
--
-- ARGV[1] holder token
-- ARGV[2] n ≥ 1
-- ARGV[3] size
-- ARGV[4] call id of this release
-- ARGV[5] idle expiry of the fence hash (ms)
-- ARGV[6] notification channel
-- ARGV[7] the fencing token of the holding the caller releases, or '':
--         a holding with another token is not the caller's
-- ARGV[8] the release's bound (server ms; see lib.lua's stale): a copy
--         of it that arrives past its bound, when its id may be forgotten,
--         changes nothing. A release that names no holding (ARGV[7] '')
--         ends permits of whatever holding of the holder it finds, and the
--         holder may hold afresh by then; one that names its holding and
--         released some of its permits would release as many again of
--         those the holding still has
-- Reply: {1, permits still held, fencing token} released (0 held: the
--        holding ended); {0, 0, 0} the holder holds nothing (or not the
--        holding named); {2, permits held, fencing token} n is more than it
--        holds, nothing changed; {3, size in force, 0} the size differs,
--        nothing changed. A repeat within the replay window changes nothing
--        and answers with the same code (the counts as they are now; the
--        token of an ended holding as ARGV[7] names it). {6, server time
--        ms}: past its bound (ARGV[8]), nothing changed.

local tok, n, size, id, idle, ch = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]
local name = ARGV[7] or ''
if ARGV[8] and stale(ARGV[8]) then
  return { 6, now_ms }
end

-- Serves the queue with the permits there are (see grant) and returns its
-- head, if anyone queued since the state hash was made (':q' set).
local function serve()
  if queued then
    return select(2, grant(ch, idle, ''))
  end
end

-- A release that names its holding, found there with that token, and
-- that no release lowered or refused (':d:'<token> unset), is no repeat:
-- a run of it would have ended the holding (no two holdings get one
-- fencing token) or set ':d:'. It need not look up its id, and takes the
-- call ids' prune marker from the state hash (see lib.lua's cached_mark).
-- The holding is read before prune (see hold), which keeps it up to date.
marks = true
local first = hold(tok)
local done
if name ~= '' and first.n > 0 and first.f == name and not first.d then
  cached_mark(KEYS[6], mark, now_ms)
else
  -- A repeat of this release changes nothing and answers as the first
  -- run did: with its code, and with the counts as they are now.
  done = recall(KEYS[6], id)
end
if done == 0 then
  return { 0, 0, 0 }
elseif done == 1 then
  if name == '' then
    -- A release that named no holding and ended one noted its token
    -- with it (below; see lib.lua's ended_by).
    local f = ended_by(KEYS[6], id)
    if f then
      return { 1, 0, tonumber(f) or 0 }
    end
  end
  return { 1, 0, tonumber(name) or 0 }
elseif done then
  prune()
  local h = hold(tok)
  if done == 3 and in_force and in_force ~= size then
    return { 3, in_force, 0 }
  end
  local live = h.n > 0 and (name == '' or h.f == name)
  if done == 2 then
    if live then
      return { 1, h.n, tonumber(h.f) }
    end
    -- The holding it lowered ended since.
    return { 1, 0, tonumber(name) or 0 }
  end
  if live then
    return { 2, h.n, tonumber(h.f) }
  end
  return { 0, 0, 0 }
end

prune()
local h = hold(tok)
local cnt, f = h.n, h.f
if cnt == 0 or (name ~= '' and f ~= name) then
  -- Nothing held, or a later holding of the same holder: the caller's
  -- ended unreleased. A release that named its holding needs no memory of
  -- this: that holding can never come back.
  if name == '' then
    noted(id, 0)
  end
  if cnt == 0 then
    tidy(serve())
  end
  return out({ 0, 0, 0 })
end
-- A refused release, and one that lowers the holding, mark it: a repeat
-- of either must find its id (see above).
if in_force and in_force ~= size then
  noted(id, 3)
  redis.call('HSET', KEYS[1], ':d:' .. tok, '1')
  return out({ 3, in_force, 0 })
end
if n > cnt then
  -- The holding may grow later: a late copy must still change nothing.
  noted(id, 3)
  redis.call('HSET', KEYS[1], ':d:' .. tok, '1')
  return out({ 2, cnt, tonumber(f) })
end

if n == cnt then
  noted(id, 1)
  if name == '' then
    -- A repeat answers with the token of the holding it ended.
    noted(tagged(id, f), 1)
  end
  -- Nobody queued since the state hash was made (':q' unset): no head.
  local head = queued and redis.call('ZRANGE', KEYS[4], '0', '0')[1]
  if not head and used <= cnt then
    -- The last holding ended and nobody waits: tidy up at once.
    redis.call('DEL', KEYS[1], KEYS[3], KEYS[4], KEYS[5])
    return out({ 1, 0, tonumber(f) })
  end
  finish(tok, cnt)
  if head then
    local _, left = grant(ch, idle, '', head)
    head = left
  end
  tidy(head)
else
  noted(id, 2)
  h.n, used = cnt - n, used - n
  redis.call('HSET', KEYS[1], tok, fmt(h.n), ':used', fmt(used), ':d:' .. tok, '1')
  tidy(serve())
end
return out({ 1, cnt - n, tonumber(f) })
