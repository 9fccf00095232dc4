-- New rows, appended to the row table and put into ready (lanes_add, lanes_add_urls).
--- @include "base"
--- @include "queue"

-- Add the n rows of `blob` (packed '<I6I4BB': due, interval, provenance, failures) with
-- consecutive ids; refused whole when they exceed the queue's capacity. Returns the first id.
local function add_rows(K, P, blob)
  local n = #blob / 12
  local cap = tonumber(rcall('HGET', K[4], 'capacity'))
  if P.next_row + n > cap then
    fail('CAPACITY', 'queue holds ' .. P.next_row .. ' rows of ' .. cap)
  end
  local first = P.next_row
  local recs, z = {}, {}
  local high, seen = P.lanes_high, {}
  for i = 0, n - 1 do
    local due, interval, prov, failures = struct.unpack('<I6I4BB', blob, i * 12 + 1)
    local lane = lane_for(P, prov == 1, interval, failures, false)
    if lane > high then high = lane end
    seen_add(seen, lane, interval)
    recs[#recs + 1] = struct.pack(REC, interval, failures,
      F_LIVE + (prov == 1 and F_DISCOVERED or 0))
    z[#z + 1] = fmt(lane * STRIDE + due)
    z[#z + 1] = mem(first + i)
  end
  rcall('SETRANGE', K[3], fmt(first * RECLEN), table.concat(recs))
  rcall('HSET', K[4], 'next_row', fmt(first + n))
  note_lane(K, P, high)
  note_bounds(K, P, seen)
  chunked('ZADD', K[1], z)
  return first
end
