-- once_reset: remove a Once's done mark, with its value (Reset), once per
-- call: go-redis sends a command again after a read timeout, and a late
-- first copy must not remove a done mark set after the Reset took effect.
--
-- KEYS[1], KEYS[2], KEYS[3] as in once_do.lua (run hash, done hash, call
--         ids)
-- ARGV[1] id of the Reset call
-- ARGV[2] the attempt's bound (server ms; see lib.lua's stale)
-- ARGV[3] '1' for the abandon of a Reset whose caller was not told its
--         outcome (its attempts got no reply): it removes nothing, and
--         notes the id, unless one of its attempts was applied, so that a
--         copy still on its way changes nothing either; no bound.
-- Reply: 1 the done mark was removed now; 0 there was none, or this is a
--        copy of a Reset already applied (nothing changed), or an abandon;
--        {6, server time ms} this copy arrived after its bound, or its
--        bound is too far ahead: it removes nothing (see lib.lua's stale),
--        also when it arrives after the replay window.

local id = ARGV[1]
if ARGV[3] == '1' then
  if not recall(KEYS[3], id) then
    note(KEYS[3], id, now(), ABANDONED)
  end
  return 0
end

if stale(ARGV[2]) then
  return { 6, now_ms }
end

if recall(KEYS[3], id) then
  return 0
end
local n = redis.call('DEL', KEYS[2])
-- Remembered also when there was nothing to remove: a late copy could
-- otherwise remove the mark of a run that succeeded since.
note(KEYS[3], id, now(), ENDED)
return n
