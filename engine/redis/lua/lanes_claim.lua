--[[ lanes_claim: one claim pass (includes/claim_pass.lua), after the lapsed leases are put back.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, now ('' = server time), budget, lease_ms, window, owner.
Returns the batch (batch_reply, includes/batch_args.lua). ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "leases"
--- @include "claim_pass"
--- @include "batch_args"
--- @include "register"

local function f_claim(K, A)
  check_version(A)
  local P = queue_meta(K)
  local now, clock = times(A[2])
  expire(K, now)
  return batch_reply(claim_pass(K, P, now, clock, tonumber(A[3]), tonumber(A[4]),
    tonumber(A[5]), A[6]))
end

register('lanes_claim', f_claim)
