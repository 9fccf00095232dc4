--[[ lanes_fail: a leased row failed: back-off, or cold after repeated failures.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, now ('' = server time), row, token, retry_at (-1: back-off), permanent (0/1).
Returns 1. ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "records"
--- @include "holder"
--- @include "leases"
--- @include "register"

local COLD_BACKOFF_DOUBLINGS = 3 -- engine.policy.COLD_BACKOFF_DOUBLINGS

local function f_fail(K, A)
  check_version(A)
  local P = queue_meta(K)
  local now, row, token = now_of(A[2]), tonumber(A[3]), tonumber(A[4])
  local retry_at = tonumber(A[5])
  check_row(K, P, row)
  local m = mem(row)
  local h = leased(K, m, token)
  if not h then fail('LEASE', 'fail row ' .. row .. ': the token is stale') end
  local r = get(K, row)
  local f = r.failures + 1
  if A[6] == '1' and f < P.cold_after then f = P.cold_after end -- a 404 will not heal
  if f > 255 then f = 255 end
  -- Back-off: 30 s doubling per failure, never longer than the row's own interval. In the cold
  -- lane, its interval, doubling per further failure up to COLD_BACKOFF_DOUBLINGS times (rl_fail).
  local backoff
  if f >= P.cold_after and P.on then
    backoff = r.interval * 1000 * 2 ^ math.min(f - P.cold_after, COLD_BACKOFF_DOUBLINGS)
  else
    backoff = math.min(30000 * 2 ^ math.min(f - 1, 20), r.interval * 1000)
  end
  local discovered = has(r.flags, F_DISCOVERED)
  r.failures = f
  r.flags = F_LIVE + (discovered and F_DISCOVERED or 0)
  leases_end(K, {m}, {h.value}, {}) -- a lapsed lease put back into ready: ZADD below moves it
  reschedule(K, P, row, r, lane_for(P, discovered, r.interval, f, false),
    retry_at >= 0 and retry_at or clamp(now + backoff), nil)
  return 1
end

register('lanes_fail', f_fail)
