--[[ lanes_scan: one step of a read of ready by cursor (ZSCAN), packed for the client: verify
and save of a big queue read ready this way (engine/redis/scan.py).
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, cursor (0 to start), count (the ZSCAN hint).
Returns {the next cursor (0: done), the members joined (8 digits each), the keys joined with
spaces}: three strings instead of two per row, which the client cuts apart with numpy (a
reply of 20,000 elements costs the client about 100 times more to parse than this one). ]]
--- @include "base"
--- @include "register"

local S_MEMBERS, S_KEYS = {}, {}

local function f_scan(K, A)
  check_version(A)
  local got = rcall('ZSCAN', K[1], A[2], 'COUNT', A[3])
  local flat, members, keys = got[2], cleared(S_MEMBERS), cleared(S_KEYS)
  for i = 1, #flat, 2 do
    members[#members + 1] = flat[i]
    keys[#keys + 1] = flat[i + 1]
  end
  return {got[1], table.concat(members), table.concat(keys, ' ')}
end

register('lanes_scan', f_scan, true)
