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

A stall is told apart from a death by the beats themselves. A beat that reaches the server in
the second half of its owner's TTL (more than TTL/2 after that owner's previous one: a pool
beats every TTL/2.5) is late: the server, or the way to it, stalled (a failover, a slot
migration, a long command), or the owner paused. A late beat judges no one, and no one is judged
for a TTL after it (the meta field hb_calm): every live owner delayed by the same stall beats
again well within that TTL. Without it, a stall a little shorter than a TTL let an owner that
beat just before it judge one that was due to beat during it, and reap it alive. ]]
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
  if not was then return {0, 0} end -- a first beat: it knows nothing of the others yet
  if now > was - math.floor(ttl / 2) then -- late (or lapsed itself): a stall; calm for a TTL
    local calm = tonumber(rcall('HGET', K[4], 'hb_calm')) or 0
    if now + ttl > calm then rcall('HSET', K[4], 'hb_calm', fmt(now + ttl)) end
    return {0, 0}
  end
  if now < (tonumber(rcall('HGET', K[4], 'hb_calm')) or 0) then return {0, 0} end
  local lapsed = rcall('ZRANGE', K[6], '-inf', fmt(now), 'BYSCORE', 'LIMIT', 0, REAP_OWNERS)
  if #lapsed == 0 then return {0, 0} end
  local dead = {}
  for i = 1, #lapsed do dead[lapsed[i]] = true end
  rcall('ZREM', K[6], unpack(lapsed))
  return {#lapsed, reap_owners(K, dead)}
end

register('lanes_heartbeat', f_heartbeat)
