-- The complete of a batch of leases (lanes_complete, lanes_complete_claim).
--- @include "base"
--- @include "queue"
--- @include "records"
--- @include "leases"

local S_WHICH, S_OK, S_ENDED, S_HELDS, S_BACK = {}, {}, {}, {}, {} -- complete_many

-- Complete rows[i] with tokens[i] (next due: nexts[i] >= 0, else now + interval). Every row id
-- is checked before anything changes; a stale token reports 0 and changes nothing. A record is
-- written only when the complete clears its failures or its urgency.
local function complete_many(K, P, now, rows, tokens, nexts)
  check_members(P, rows)
  local live = live_leases(K, rows, tokens)
  local which = cleared(S_WHICH)
  for i = 1, #rows do
    if live[i] then which[#which + 1] = rows[i] end
  end
  local recs = get_many(K, which)
  local ok, ended, helds, back = cleared(S_OK), cleared(S_ENDED), cleared(S_HELDS), cleared(S_BACK)
  local high, seen = P.lanes_high, {}
  local k = 0
  local texts = {} -- key -> its decimal string: a batch's rows share few keys (one `now`)
  for i = 1, #rows do
    local row = rows[i]
    if live[i] then
      k = k + 1
      local interval, failures, was = record(recs[k])
      local discovered = has(was, F_DISCOVERED)
      local flags = F_LIVE + (discovered and F_DISCOVERED or 0)
      if failures ~= 0 or was ~= flags then
        put(K, tonumber(row), {interval = interval, failures = 0, flags = flags})
      end
      local lane = lane_for(P, discovered, interval, 0, false)
      local due = (nexts and nexts[i] >= 0) and nexts[i] or clamp(now + interval * 1000)
      if lane > high then high = lane end
      seen_add(seen, lane, interval)
      ended[#ended + 1] = row
      helds[#helds + 1] = live[i]
      local key = key_of(lane, due)
      local text = texts[key]
      if not text then
        text = fmt(key)
        texts[key] = text
      end
      back[#back + 1] = text
      back[#back + 1] = row
      ok[i] = 1
    else
      ok[i] = 0
    end
  end
  leases_end(K, ended, helds, back)
  note_lane(K, P, high)
  note_bounds(K, P, seen)
  return ok
end
