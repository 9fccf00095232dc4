--[[ lanes_renew: extend a lease: the row moves to a batch of its own, under a new token.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua).
ARGV: version, now ('' = server time), row, token, lease_ms, owner.
Returns the new token (the old one is stale). A lapsed lease put back into ready is taken out
of it again, held by `owner`. ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "holder"
--- @include "leases"
--- @include "register"

local function f_renew(K, A)
  check_version(A)
  local P = queue_meta(K)
  local now, row, token = now_of(A[2]), tonumber(A[3]), tonumber(A[4])
  check_row(K, P, row)
  local m = mem(row)
  local h = leased(K, m, token)
  if not h then fail('LEASE', 'renew row ' .. row .. ': the token is stale') end
  local key, owner = h.key, h.owner
  local z = rcall('ZSCORE', K[1], m)
  if z then
    rcall('ZREM', K[1], m)
    key, owner = tonumber(z), A[6]
  end
  -- the row leaves its batch (the batch ends if it was its last row) for one of its own
  local hdel = {}
  batches_end(K, {[h.batch] = 1}, {[h.batch] = h.n}, hdel)
  if #hdel > 0 then rcall('HDEL', K[5], unpack(hdel)) end
  local tok = next_tokens(P, 1, clock_ms())
  local t, exp = fmt(tok), fmt(clamp(now + tonumber(A[5])))
  rcall('HSET', K[4], 'token', t)
  rcall('HSET', K[5], m, holder_value(t, t, '1', exp, fmt(key), owner), batch_field(t), '1:' .. m)
  rcall('ZADD', K[2], exp, t)
  return tok
end

register('lanes_renew', f_renew)
