--[[ lanes_prioritize_many: make many rows due now, urgent (rush) or in their own lanes
(includes/prioritize.lua), a removed row skipped: a scope of POST /api/prioritize.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, now ('' = server time), rush (0/1), row, row, ... (the caller sends a few
thousand a call, so the server is never held long).
Returns how many rows were made due. ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "records"
--- @include "prioritize"
--- @include "register"

local function f_prioritize_many(K, A)
  check_version(A)
  local P, now, rush = queue_meta(K), now_of(A[2]), A[3] == '1'
  for i = 4, #A do check_row(K, P, tonumber(A[i])) end -- every row exists, or nothing changes
  local done = 0
  for i = 4, #A do
    local row = tonumber(A[i])
    if has(get(K, row).flags, F_LIVE) then
      prioritize_row(K, P, now, row, rush)
      done = done + 1
    end
  end
  return done
end

register('lanes_prioritize_many', f_prioritize_many)
