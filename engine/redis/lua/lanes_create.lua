--[[ lanes_create: create a queue, unless one is there.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, policy fields (on, bands, cold, urgent, s1, s2, s3, remainder, weights),
  policy json, capacity, created_ms.
Returns 1 if created, 0 if the queue already existed. ]]
--- @include "base"
--- @include "register"

local function f_create(K, A)
  check_version(A)
  if rcall('EXISTS', K[4]) == 1 then return 0 end
  rcall('HSET', K[4], 'layout', LAYOUT, 'next_row', 0, 'token', 0, 'lanes_high', -1,
    'p_on', A[2], 'p_bands', A[3], 'p_cold', A[4], 'p_urgent', A[5], 'p_s1', A[6],
    'p_s2', A[7], 'p_s3', A[8], 'p_edf', A[9], 'p_w', A[10], 'policy', A[11], 'capacity', A[12],
    'created_ms', A[13], 'c0', 0, 'c1', 0, 'c2', 0, 'c3', 0)
  return 1
end

register('lanes_create', f_create)
