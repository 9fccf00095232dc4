--[[ lanes_prioritize_many: make many rows due now, urgent (rush) or in their own lanes
(includes/prioritize.lua), a removed row skipped: a scope of POST /api/prioritize.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, now ('' = server time), rush (0/1), the rows' members (MEMBER, 8 digits each)
joined (the caller sends some thousands a call, so the server is never held long).
Every row is checked before any changes. Returns how many rows were made due. ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "batch_args"
--- @include "prioritize"
--- @include "register"

local S_MANY = {} -- f_prioritize_many

local function f_prioritize_many(K, A)
  check_version(A)
  local P, now, rush = queue_meta(K), now_of(A[2]), A[3] == '1'
  return prioritize_rows(K, P, now, members_of(A[4] or '', S_MANY), rush)
end

register('lanes_prioritize_many', f_prioritize_many)
