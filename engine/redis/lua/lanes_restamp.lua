--[[ lanes_restamp: re-encode up to `limit` rows written with lanes disabled (lane 0, not
urgent) into their derived lanes, due times untouched. Refused while lanes are enabled.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, limit.
Returns {rows moved, 1 if none is left (else 0)}. ]]
--- @include "base"
--- @include "queue"
--- @include "records"
--- @include "holder"
--- @include "leases"
--- @include "register"

local function f_restamp(K, A)
  check_version(A)
  local P = queue_meta(K)
  if P.on then fail('NOTALLOWED', 'restamp is refused while lanes are enabled') end
  local limit = tonumber(A[2])
  local on = {}
  for k, v in pairs(P) do on[k] = v end
  on.on = true
  local done, skip, left = 0, 0, false
  while true do
    local batch = rcall('ZRANGE', K[1], 0, fmt(HORIZON), 'BYSCORE', 'LIMIT', skip, 256,
      'WITHSCORES')
    if #batch == 0 then break end
    for i = 1, #batch, 2 do
      local row = tonumber(batch[i])
      local r = get(K, row)
      local lane = lane_for(on, has(r.flags, F_DISCOVERED), r.interval, r.failures,
        has(r.flags, F_URGENT))
      if lane == 0 then
        skip = skip + 1
      elseif done == limit then
        left = true
        break
      else
        reschedule(K, P, row, r, lane, tonumber(batch[i + 1]), nil) -- lane 0: key = due
        done = done + 1
      end
    end
    if left then break end
  end
  if not left then -- rows in flight keep their key in their holder entry
    local ms, holds = batch_rows(K, rcall('ZRANGE', K[2], 0, -1))
    for i, m in ipairs(ms) do
      local row = tonumber(m)
      local r = get(K, row)
      local h = holds[i]
      local lane = lane_for(on, has(r.flags, F_DISCOVERED), r.interval, r.failures,
        has(r.flags, F_URGENT))
      local was, due = split(h.key)
      if was == 0 and lane ~= 0 then
        if done == limit then
          left = true
          break
        end
        reschedule(K, P, row, r, lane, due, h)
        done = done + 1
      end
    end
  end
  return {done, left and 0 or 1}
end

register('lanes_restamp', f_restamp)
