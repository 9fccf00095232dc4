--[[ lanes_reap: end the leases of owners whose process is gone (RedisEngine.reap checks
that). Each row in flight goes back to ready with the key its holder entry keeps, as a release
would put it, so it is claimable at once; a lapsed lease already back in ready only loses its
holder entry.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, then the owner ids.
Returns how many rows came back. ]]
--- @include "base"
--- @include "queue"
--- @include "holder"
--- @include "leases"
--- @include "register"

local function f_reap(K, A)
  check_version(A)
  queue_meta(K)
  local dead = {}
  for i = 2, #A do dead[A[i]] = true end
  local held = rcall('HGETALL', K[5])
  local gone, helds, keys = {}, {}, {}
  for i = 1, #held, 2 do
    local h = string.byte(held[i]) ~= 98 and holding(held[i + 1]) -- 'b': a batch's record
    if h and dead[h.owner] then
      gone[#gone + 1] = held[i]
      helds[#helds + 1] = held[i + 1]
      keys[#keys + 1] = fmt(h.key)
    end
  end
  local waiting = #gone > 0 and per_row('ZMSCORE', K[1], gone) or {}
  local back = {}
  for i = 1, #gone do
    if not waiting[i] then -- in flight (a lapsed lease back in ready keeps its ready score)
      back[#back + 1] = keys[i]
      back[#back + 1] = gone[i]
    end
  end
  local n = #back / 2
  leases_end(K, gone, helds, back)
  return n
end

register('lanes_reap', f_reap)
