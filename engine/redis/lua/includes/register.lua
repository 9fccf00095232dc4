-- Every registered function goes through `register`, which binds the standard functions on
-- the first call (base.lua).
--- @include "base"

local function register(name, fn, ro)
  local function entry(K, A)
    if not rcall then bind() end
    return fn(K, A)
  end
  redis.register_function{function_name = name, callback = entry,
    flags = ro and {'no-writes'} or {}}
end
