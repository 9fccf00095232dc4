--[[ lanes_release: give a batch of leased rows back, each with the key it kept.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, now ('' = server time), rows, tokens (rows_tokens, includes/batch_args.lua).
Returns one 1 (released) or 0 (stale token) per row. ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "leases"
--- @include "batch_args"
--- @include "register"

-- Give rows[i] back with the key their holder entry keeps: no record is read or written. A
-- lapsed lease already put back into ready keeps its ready score (its holder entry's key is
-- void: a prioritize may have moved the row since).
local function release_many(K, P, now, rows, tokens)
  check_members(P, rows)
  local live = live_leases(K, rows, tokens)
  local which = {}
  for i = 1, #rows do
    if live[i] then which[#which + 1] = rows[i] end
  end
  local waiting = #which > 0 and per_row('ZMSCORE', K[1], which) or {}
  local ok, ended, helds, back = {}, {}, {}, {}
  local k = 0
  for i = 1, #rows do
    if live[i] then
      k = k + 1
      ended[#ended + 1] = rows[i]
      helds[#helds + 1] = live[i]
      if not waiting[k] then
        back[#back + 1] = string.match(live[i], '^%d+:%d+:%d+:%d+:(%d+):')
        back[#back + 1] = rows[i]
      end
      ok[i] = 1
    else
      ok[i] = 0
    end
  end
  leases_end(K, ended, helds, back)
  return ok
end

local function f_release(K, A)
  check_version(A)
  local P = queue_meta(K)
  local rows, tokens = rows_tokens(A, 3)
  return release_many(K, P, now_of(A[2]), rows, tokens)
end

register('lanes_release', f_release)
