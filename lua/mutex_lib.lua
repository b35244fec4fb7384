-- mutex_lib: definitions shared by mutex_lock.lua and mutex_unlock.lua,
-- which begin with this file (lua.Source puts it in front).

-- Call ids. A field holds the ids of the last few calls, space-separated,
-- so that a go-redis retry that arrives after other calls of the same owner
-- is still recognised as a repeat.
local function seen(list, id)
  return list ~= nil and list ~= false and string.find(' ' .. list .. ' ', ' ' .. id .. ' ', 1, true) ~= nil
end
local function remember(list, id)
  if not list or list == '' then
    return id
  end
  local l = list .. ' ' .. id
  local _, n = string.gsub(l, ' ', ' ')
  if n >= 16 then
    l = string.sub(l, string.find(l, ' ', 1, true) + 1)
  end
  return l
end
