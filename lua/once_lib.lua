-- once_lib: definitions shared by once_do.lua, once_release.lua and
-- once_reset.lua, which begin with lib.lua and this file (lua.Source puts
-- them in front).

-- What the call ids zset (KEYS[3], see lib.lua's recall and note) says
-- about a call that is over: it took the run, its run has ended (f's
-- outcome applied by once_release.lua, which a late copy of that script
-- must not apply again; a 'fail' is remembered so only if it released the
-- run), its caller abandoned it (or its 'fail' found the run not its own),
-- or it waited and then found the Once done. A later copy of any attempt
-- of such a call takes nothing. (A Reset that took effect is remembered as
-- ENDED.)
local ENDED, RAN, ABANDONED, WAITED = 0, 1, 2, 3

-- Server time in ms (lib.lua's clock).
local function now()
  clock()
  return now_ms
end
