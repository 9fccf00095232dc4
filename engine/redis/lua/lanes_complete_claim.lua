--[[ lanes_complete_claim: one worker cycle in one round trip: complete the batch, then
one claim pass.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, now ('' = server time), budget, lease_ms, window, owner, rows, tokens
  (rows_tokens, includes/batch_args.lua).
Returns {the new batch (batch_reply), one byte per completed row (1: its token was live)}. ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "leases"
--- @include "complete"
--- @include "claim_pass"
--- @include "batch_args"
--- @include "register"

local S_BYTES = {} -- f_complete_claim

local function f_complete_claim(K, A)
  check_version(A)
  local P = queue_meta(K)
  local now, clock = times(A[2])
  local rows, tokens = rows_tokens(A, 7)
  local ok = complete_many(K, P, now, rows, tokens, nil)
  expire(K, now)
  local first, members, keys = claim_pass(K, P, now, clock, tonumber(A[3]), tonumber(A[4]),
    tonumber(A[5]), A[6])
  local bytes = cleared(S_BYTES)
  for i = 1, #ok do bytes[i] = ok[i] == 1 and '\1' or '\0' end
  return {batch_reply(first, members, keys), table.concat(bytes)}
end

register('lanes_complete_claim', f_complete_claim)
