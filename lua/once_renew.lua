-- once_renew: extend the run leases of Once calls that still hold them,
-- one or many in one call. It never moves an expiry earlier.
--
-- KEYS[i] run hash of lease i
-- ARGV[2i-1] token of the runner's call of lease i
-- ARGV[2i]   lease TTL of lease i (ms)
-- A run key of another type (foreign data) counts as gone, for its lease
-- only (see lib.lua's peek).
-- Reply: an array with, for each lease in order, 1 extended or 0 gone.

local out = {}
for i = 1, #KEYS do
  if peek('HGET', KEYS[i], 't') == ARGV[2 * i - 1] then
    extend_key(KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
