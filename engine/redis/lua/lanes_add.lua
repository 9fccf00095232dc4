--[[ lanes_add: add rows (includes/add_rows.lua).
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, blob of n rows packed '<I6I4BB' (due, interval, provenance, failures).
Returns the first row id; the rows take consecutive ids. ]]
--- @include "base"
--- @include "queue"
--- @include "add_rows"
--- @include "register"

local function f_add(K, A)
  check_version(A)
  return add_rows(K, queue_meta(K), A[2])
end

register('lanes_add', f_add)
