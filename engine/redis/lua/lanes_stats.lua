--[[ lanes_stats: the queue per lane and its rows in flight.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, now ('' = server time), lanes.
Returns {now, per lane: ready rows, ready rows due, the due time of the first ready row (-1:
none); then, per row in flight: row, lane, due, expiry, owner}. ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "leases"
--- @include "register"

local function f_stats(K, A)
  check_version(A)
  queue_meta(K)
  local now, nl = now_of(A[2]), tonumber(A[3])
  local per = {}
  for l = 0, nl - 1 do
    local lo, top = fmt(l * STRIDE), '(' .. fmt((l + 1) * STRIDE)
    local first = rcall('ZRANGE', K[1], lo, top, 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
    per[#per + 1] = rcall('ZCOUNT', K[1], lo, top)
    per[#per + 1] = rcall('ZCOUNT', K[1], lo, fmt(l * STRIDE + now))
    per[#per + 1] = #first > 0 and tonumber(first[2]) - l * STRIDE or -1
  end
  local flight = {}
  local ms, holds = batch_rows(K, rcall('ZRANGE', K[2], 0, -1))
  for i, m in ipairs(ms) do
    local h = holds[i]
    local lane, due = split(h.key)
    flight[#flight + 1] = tonumber(m)
    flight[#flight + 1] = lane
    flight[#flight + 1] = due
    flight[#flight + 1] = h.expiry
    flight[#flight + 1] = h.owner
  end
  return {now, per, flight}
end

register('lanes_stats', f_stats, true)
