--[[ lanes_set_policy: replace a queue's policy.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, policy fields (on, bands, cold, urgent, s1, s2, s3, remainder, weights),
  policy json.
Returns 1. ]]
--- @include "base"
--- @include "queue"
--- @include "register"

local function f_set_policy(K, A)
  check_version(A)
  queue_meta(K)
  local was = rcall('HMGET', K[4], 'p_on', 'p_bands')
  rcall('HSET', K[4], 'p_on', A[2], 'p_bands', A[3], 'p_cold', A[4], 'p_urgent', A[5],
    'p_s1', A[6], 'p_s2', A[7], 'p_s3', A[8], 'p_edf', A[9], 'p_w', A[10], 'policy', A[11])
  if was[1] ~= A[2] or was[2] ~= A[3] then
    -- other lanes: the rows of the old layout weigh none of the new (csrc/segment.c
    -- rl_policy_set clears the lanes' wv_min, wv_max the same way)
    local names = {}
    for l = 0, 63 do names[#names + 1] = 'v' .. l end
    rcall('HDEL', K[4], unpack(names))
  end
  derive_weights(K, queue_meta(K)) -- the band lanes move with the bands
  return 1
end

register('lanes_set_policy', f_set_policy)
