-- A row made due now (lanes_prioritize, and lanes_add_urls for a parked row).
--- @include "base"
--- @include "queue"
--- @include "records"
--- @include "holder"

-- Make `row` due at `now`: urgent (lane 0) with `rush`, else in its own lane, urgency cleared.
-- A row in flight keeps its lease; the new key waits in its holder entry.
local function prioritize_row(K, P, now, row, rush)
  check_row(K, P, row)
  local r = get(K, row)
  if not has(r.flags, F_LIVE) then fail('VALUE', 'row ' .. row .. ' was removed') end
  local discovered = has(r.flags, F_DISCOVERED)
  r.flags = F_LIVE + (discovered and F_DISCOVERED or 0) + (rush and F_URGENT or 0)
  local _, h = where(K, mem(row)) -- in flight: its key waits in the holder entry
  reschedule(K, P, row, r, lane_for(P, discovered, r.interval, r.failures, rush), now, h)
  return 1
end
