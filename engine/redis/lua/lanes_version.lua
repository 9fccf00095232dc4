--[[ lanes_version: the library's version and the layout it reads.
KEYS: none.
ARGV: none.
Returns {VERSION, LAYOUT}. ]]
--- @include "base"
--- @include "register"

local function f_version(K, A)
  return {VERSION, LAYOUT}
end

register('lanes_version', f_version, true)
