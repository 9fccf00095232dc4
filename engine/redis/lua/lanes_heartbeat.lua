--[[ lanes_heartbeat: an owner says it is alive, and the owners whose heartbeat lapsed lose
their leases.
KEYS: ready, lease, rows, meta, holder (a queue's five keys: includes/base.lua), then beats
(ZSET: member = owner id, score = the time its heartbeat lapses, ms).
ARGV: version, now ('' = server time), owner, ttl_ms (0: the owner leaves; its entry goes).
Returns {owners reaped, rows put back}.

A heartbeat is an entry in beats, not a key with a TTL: a function must name every key it
touches, and a lapsed key cannot be found again but by SCAN; a ZSET scored by the lapse time
gives the lapsed owners with one range read, on the queue's slot. An owner that never beats
(a client outside a pool) is never judged here: its leases come back by expiry, or by reap on
its host. An owner reaped by mistake (alive, but cut off for longer than its TTL) finds its
tokens stale: its late completes are refused, and the rows were put back, never lost.

Only an owner whose own heartbeat had not lapsed judges the others: when the server stalled or
moved (a failover, a slot migration, a long command) every owner's beat lapsed together, and
the first to reach it again must not reap the live ones. Its beat renews it; the next beats,
a period later, judge. ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "reap"
--- @include "register"

local REAP_OWNERS = 16 -- lapsed owners judged per call (the rest by the next beats)

local function f_heartbeat(K, A)
  check_version(A)
  queue_meta(K)
  local now, owner, ttl = now_of(A[2]), A[3], tonumber(A[4])
  if not ttl or ttl < 0 or ttl ~= math.floor(ttl) then fail('VALUE', 'bad ttl_ms') end
  local was = tonumber(rcall('ZSCORE', K[6], owner))
  if ttl == 0 then
    rcall('ZREM', K[6], owner)
  else
    rcall('ZADD', K[6], fmt(now + ttl), owner)
  end
  if not was or was < now then return {0, 0} end -- first beat, or lapsed itself: no judge
  local lapsed = rcall('ZRANGE', K[6], '-inf', fmt(now), 'BYSCORE', 'LIMIT', 0, REAP_OWNERS)
  if #lapsed == 0 then return {0, 0} end
  local dead = {}
  for i = 1, #lapsed do dead[lapsed[i]] = true end
  rcall('ZREM', K[6], unpack(lapsed))
  return {#lapsed, reap_owners(K, dead)}
end

register('lanes_heartbeat', f_heartbeat)
