--[[ lanes_reap: end the leases of owners whose process is gone (RedisEngine.reap checks
that): includes/reap.lua.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, then the owner ids.
Returns how many rows came back. ]]
--- @include "base"
--- @include "queue"
--- @include "reap"
--- @include "register"

local function f_reap(K, A)
  check_version(A)
  queue_meta(K)
  local dead = {}
  for i = 2, #A do dead[A[i]] = true end
  return reap_owners(K, dead)
end

register('lanes_reap', f_reap)
