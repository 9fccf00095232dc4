--[[ lanes_prioritize: make a row due now, urgent (rush) or in its own lane
(includes/prioritize.lua).
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, now ('' = server time), row, rush (0/1).
Returns 1. ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "prioritize"
--- @include "register"

local function f_prioritize(K, A)
  check_version(A)
  return prioritize_row(K, queue_meta(K), now_of(A[2]), tonumber(A[3]), A[4] == '1')
end

register('lanes_prioritize', f_prioritize)
