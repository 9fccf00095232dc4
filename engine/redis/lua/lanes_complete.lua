--[[ lanes_complete: complete a batch of leases.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, now ('' = server time), rows, tokens (rows_tokens, includes/batch_args.lua),
  has_next (0/1), then nexts[n] (the rows' next due times, -1: now + interval) if has_next.
Returns one 1 (the token was live, the row completed) or 0 (stale) per row. ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "complete"
--- @include "batch_args"
--- @include "register"

local function f_complete(K, A)
  check_version(A)
  local P = queue_meta(K)
  local now = now_of(A[2])
  local rows, tokens, at = rows_tokens(A, 3)
  local nexts = nil
  if A[at] == '1' then
    nexts = {}
    for i = 1, #rows do nexts[i] = tonumber(A[at + i]) end
  end
  return complete_many(K, P, now, rows, tokens, nexts)
end

register('lanes_complete', f_complete)
