--[[ lanes_reclassify: a row's provenance set again, its lane derived again; due time, failures
and urgency stay, and a row in flight keeps its lease (its key waits in the holder entry).
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, row, provenance (0 submitted, 1 discovered).
Returns 1, or 0 when the row had that provenance already. ]]
--- @include "base"
--- @include "queue"
--- @include "records"
--- @include "holder"
--- @include "register"

local function f_reclassify(K, A)
  check_version(A)
  local P = queue_meta(K)
  local row, discovered = tonumber(A[2]), A[3] == '1'
  check_row(K, P, row)
  local r = get(K, row)
  if not has(r.flags, F_LIVE) then fail('VALUE', 'row ' .. row .. ' was removed') end
  if has(r.flags, F_DISCOVERED) == discovered then return 0 end
  r.flags = r.flags + (discovered and F_DISCOVERED or -F_DISCOVERED)
  local key, h = where(K, mem(row))
  local _, due = split(key)
  local lane = lane_for(P, discovered, r.interval, r.failures, has(r.flags, F_URGENT))
  reschedule(K, P, row, r, lane, due, h)
  return 1
end

register('lanes_reclassify', f_reclassify)
