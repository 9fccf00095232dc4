--[[ lanes_remove: remove a row: out of ready, its lease (if any) ended.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, row.
Returns 1. ]]
--- @include "base"
--- @include "queue"
--- @include "records"
--- @include "leases"
--- @include "register"

local function f_remove(K, A)
  check_version(A)
  local P = queue_meta(K)
  local row = tonumber(A[2])
  check_row(K, P, row)
  local r = get(K, row)
  if not has(r.flags, F_LIVE) then fail('VALUE', 'row ' .. row .. ' was removed') end
  r.flags = r.flags - F_LIVE
  if has(r.flags, F_URGENT) then r.flags = r.flags - F_URGENT end
  put(K, row, r) -- and the lease ends below: its holder's token is stale from now on
  local m = mem(row)
  rcall('ZREM', K[1], m)
  local v = rcall('HGET', K[5], m)
  if v then leases_end(K, {m}, {v}, {}) end
  return 1
end

register('lanes_remove', f_remove)
