--[[ One claim pass, exactly as engine.policy.reference_pass and csrc/claim.c's rl_claim, in the
same steps under the same names:

  step                Lua (this file)      C (csrc/claim.c)                   reference_pass
  accrue              accrue               rl_claim: class_has_due,           accrue
                                             credit_accrue
  urgent cap          urgent_cap           rl_claim: credit_reserve,          urgent_cap
                                             lane_take, credit_refund
  floors              floors               rl_claim: credit_reserve,          floors
                                             class_take, credit_refund
  remainder edf       remainder_edf        remainder_lateness (P.unit)        remainder_edf
  remainder lateness  remainder_lateness   remainder_lateness                 remainder_lateness
  lane order          lane_order           rl_claim: a loop of lane_take      a loop of take
  commit              commit               rl_claim: credit_absorb,           commit
                                             notes_flush, floors_raise

  1. accrue: each share class with a due row accrues share * budget credit, capped at that
     plus ONE;
  2. urgent_cap: urgent (lane 0) takes at most its credit while capped;
  3. floors: each min_share class, its lanes in order, takes up to its credit;
  4. the remainder in lane order (lane_order), or one grant at a time to the lane whose head is
     latest relative to its interval, times the lane's weight (remainder_lateness), or latest
     alone (remainder_edf), heads compared in quanta of a 64th, ties to the lower lane;
  5. commit: what a floor class got from the remainder counts against its credit; the credits,
     the batch's leases and the counters are written.
With lanes disabled the pass is lane_order over every lane, with no shares (as C and Python).

Per lane one seek: ZRANGE ready lane*2^42 lane*2^42+now BYSCORE LIMIT taken n, where `taken`
counts the rows this pass already took from the lane: they leave ready with one ZREM at commit,
so a second seek of a lane skips them. `window` bounds the rows one lane grants in one pass.
The lateness remainder finds its lanes with ZRANGE ready lane*2^42 +inf BYSCORE LIMIT taken 1:
the first row of the next lane that holds any (late_heads).
(C's lane_take grants each row with a CAS on the row as it goes, so its commit has only the
credits and the lane bookkeeping left; floors_raise raises the index's skip floors, which have
nothing to do with the share floors of step 3.) ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "records"
--- @include "holder"

local S_LANES, S_MEMBERS, S_KEYS, S_HOLD = {}, {}, {}, {} -- pass_open, batch_lease

-- A pass (C's Pass): the queue (K, P), the time, the budget and what is left of it, per lane
-- the rows granted (`grants`) and taken from ready (`taken`), the batch (a grant's lane, member
-- and key text, in grant order), and with lanes enabled the share credits (`cred`, by class),
-- each class's lanes (`lanes_of`) and the grants per lane before the remainder (`before`).
local function pass_open(K, P, now, budget, window)
  local nl = P.lanes_high + 1
  local pass = {K = K, P = P, now = now, nl = nl, budget = budget, remaining = budget,
    window = window, grants = {}, taken = {}, his = {},
    lanes = cleared(S_LANES), members = cleared(S_MEMBERS), keys = cleared(S_KEYS),
    cred = false, lanes_of = false, before = false}
  for l = 0, nl - 1 do pass.grants[l] = 0; pass.taken[l] = 0 end
  return pass
end

-- A lane's range in ready, from its first key (the same text in every pass of every queue:
-- kept between calls) to its key due now (formatted once per pass): a lane is sought often.
local LANE_LO = {}
local function lane_lo(lane)
  local v = LANE_LO[lane]
  if not v then v = fmt(lane * STRIDE); LANE_LO[lane] = v end
  return v
end
local function lane_hi(pass, lane)
  local v = pass.his[lane]
  if not v then v = fmt(lane * STRIDE + pass.now); pass.his[lane] = v end
  return v
end

-- Grant up to `want` due rows of `lane` (within what is left of the budget and the window).
local function take(pass, lane, want)
  local remaining = pass.remaining
  if want <= 0 or remaining <= 0 or lane >= pass.nl then return 0 end -- lane >= nl: never written
  local taken = pass.taken
  local n = math.min(want, remaining, pass.window - taken[lane])
  if n <= 0 then return 0 end
  local got = rcall('ZRANGE', pass.K[1], lane_lo(lane), lane_hi(pass, lane), 'BYSCORE',
    'LIMIT', taken[lane], n, 'WITHSCORES')
  local members, keys, lanes = pass.members, pass.keys, pass.lanes
  local at = #members
  for i = 1, #got, 2 do -- a key's text (%.17g) is exact below 2^53: no number is parsed
    at = at + 1
    members[at], keys[at], lanes[at] = got[i], got[i + 1], lane
  end
  local k = #got / 2
  taken[lane] = taken[lane] + k
  pass.grants[lane] = pass.grants[lane] + k
  pass.remaining = remaining - k
  return k
end

local function has_due(pass, lane)
  return #rcall('ZRANGE', pass.K[1], lane_lo(lane), lane_hi(pass, lane), 'BYSCORE',
    'LIMIT', pass.taken[lane], 1) > 0
end

-- Lanes from `first` on take what is left of the budget, in lane order (with lanes disabled, and
-- the lane-order remainder).
local function lane_order(pass, first)
  for l = first, pass.nl - 1 do
    if pass.remaining <= 0 then return end
    take(pass, l, pass.remaining)
  end
end

-- The lanes below nl of each class, in order.
local function class_lanes(P, nl)
  local lanes_of = {[0] = {}, {}, {}, {}}
  for l = 0, nl - 1 do
    local t = lanes_of[class_of(P, l)]
    t[#t + 1] = l
  end
  return lanes_of
end

-- 1. Urgent while capped (even at share 0: it sheds credit banked under an earlier policy), and
-- the floor classes with a share, accrue if a lane of theirs has a due row.
local function accrue(pass, capped)
  local P, cred, budget = pass.P, pass.cred, pass.budget
  for cls = 0, 3 do
    local fp = cls == 0 and (capped and P.urgent or -1) or P.shares[cls]
    if fp > 0 or (cls == 0 and fp == 0) then
      for _, l in ipairs(pass.lanes_of[cls]) do
        if has_due(pass, l) then
          cred[cls] = math.min(cred[cls] + fp * budget, fp * budget + ONE)
          break
        end
      end
    end
  end
end

-- 2. Urgent, capped: lane 0 takes the whole grants its credit holds.
local function urgent_cap(pass)
  local cred = pass.cred
  local want = math.max(0, math.floor(cred[0] / ONE))
  cred[0] = cred[0] - take(pass, 0, want) * ONE
end

-- 3. Each class with a min_share takes the whole grants its credit holds, its lanes in order.
local function floors(pass)
  local cred = pass.cred
  for cls = 1, 3 do
    if pass.P.shares[cls] > 0 then
      local want = math.max(0, math.floor(cred[cls] / ONE))
      for _, l in ipairs(pass.lanes_of[cls]) do
        local got = take(pass, l, want)
        want = want - got
        cred[cls] = cred[cls] - got * ONE
      end
    end
  end
end

-- The heads remainder_lateness weighs are read as picks reach them: a lane's first due row
-- when it is found, then, each time a pick uses up what was read of a lane, its next rows, half
-- as many as picks are left (most picks go to few lanes; a read costs the server about what
-- four more rows in it do). The rows and the picks are those of reading them all at once.
--
-- A lane's heads (late_lane), kept between calls as base.lua's S_* scratch tables are (tables
-- made per lane and per pass, and the collector's work on them, were a tenth of a cycle): the
-- due rows read so far in parallel arrays (members and keys as ZRANGE gives them, what a grant
-- takes; due times; intervals), how many were read (`read`) and have their interval (`ivs_read`),
-- the next to weigh (`at`) and its weight * lateness / interval (late_weigh), how many it may
-- grant (`limit`: what is left of the budget and of its window) and the lane's weight.
local S_HEADS, S_LATE, S_PICKS, S_IDX, S_MS = {}, {}, {}, {}, {}
local function late_lane(pass, l)
  local h = S_HEADS[l]
  if not h then
    h = {lane = l, ms = {}, keys = {}, dues = {}, ivs = {}}
    S_HEADS[l] = h
  end
  local limit = pass.window - pass.taken[l] -- what its window leaves, within the budget's
  if limit > pass.remaining then limit = pass.remaining end
  h.at, h.read, h.ivs_read, h.limit = 1, 0, 0, limit
  h.w = pass.unit and 1 or pass.P.weights[l] or ONE
  return h
end

-- Row j of h's heads, read (member and key as ZRANGE gives them, its due time); its member is
-- appended to `ms`, the rows whose intervals are still to read.
local function late_row(h, j, member, key, due, ms)
  h.ms[j], h.keys[j], h.dues[j], h.read = member, key, due, j
  ms[#ms + 1] = member
end

-- The due rows of h's lane among got (ZRANGE WITHSCORES), up to `n`, appended to h, and their
-- members to `ms` (their intervals are read after, all in one); reading stops at the first row
-- not due, or of a later lane (its key is higher still). When fewer than `n` were due, h holds
-- every due row its lane may grant.
local function late_keep(pass, h, got, n, ms)
  local base, was = h.lane * STRIDE, h.read
  local hi = base + pass.now
  for i = 1, math.min(#got, 2 * n), 2 do
    local key = tonumber(got[i + 1])
    if key > hi then break end
    late_row(h, h.read + 1, got[i], got[i + 1], key - base, ms)
  end
  if h.read - was < n then h.limit = h.read end
end

-- The intervals of the rows of `heads` (a list) late_keep read, whose members are `ms` (an
-- interval of 0 as 1 s), one read for them all.
local function late_intervals(pass, heads, ms)
  if #ms == 0 then return end
  if pass.unit then -- edf: every interval 1 s, none read
    for _, h in ipairs(heads) do
      for j = h.ivs_read + 1, h.read do h.ivs[j] = 1 end
      h.ivs_read = h.read
    end
    return
  end
  local recs, at = get_many(pass.K, ms), 0
  for _, h in ipairs(heads) do
    for j = h.ivs_read + 1, h.read do
      at = at + 1
      local iv = interval_of(recs[at])
      h.ivs[j] = iv > 0 and iv or 1
    end
    h.ivs_read = h.read
  end
end

-- h's lane's next due rows after the `h.read` already read, up to `want` (and what its limit
-- leaves), with their intervals; false when it has none left.
local function late_refill(pass, h, want)
  local l = h.lane
  local n = math.min(want, h.limit - h.read)
  if n <= 0 then return false end
  local got = rcall('ZRANGE', pass.K[1], lane_lo(l), lane_hi(pass, l), 'BYSCORE', 'LIMIT',
    pass.taken[l] + h.read, n, 'WITHSCORES')
  local ms, was = cleared(S_MS), h.read
  late_keep(pass, h, got, n, ms)
  if h.read == was then return false end
  late_intervals(pass, {h}, ms)
  return true
end

-- The heads remainder_lateness weighs, of each lane from `first` on with a due row, in lane
-- order. One ZRANGE per such lane finds it and reads its first row: from a lane's first row
-- not yet taken on to +inf, so the row comes from the next lane that holds any, past the empty
-- ones (a layout of 64 lanes of which few are used). A row of a later lane is its first row:
-- when a step before took from that lane, the lane is read again past what it took.
local function late_heads(pass, first)
  local live, ms, taken = cleared(S_LATE), cleared(S_MS), pass.taken
  local l = first
  while l < pass.nl do
    local got = rcall('ZRANGE', pass.K[1], lane_lo(l), '+inf', 'BYSCORE', 'LIMIT', taken[l],
      1, 'WITHSCORES')
    if #got == 0 then break end
    local key = tonumber(got[2])
    local at = math.floor(key / STRIDE)
    if at >= pass.nl then break end
    if at == l or taken[at] == 0 then
      local due = key - at * STRIDE
      if due <= pass.now then -- else the lane has no due row
        local h = late_lane(pass, at)
        if h.limit > 0 then
          late_row(h, 1, got[1], got[2], due, ms)
          live[#live + 1] = h
        end
      end
      at = at + 1
    end
    l = at
  end
  late_intervals(pass, live, ms)
  return live
end

-- A head's quantum, kept on its lane (h.q) while it is the lane's head: its weight * lateness /
-- interval, a product then a quotient of doubles each rounded once (as C and reference_pass
-- round them), and of that double its exponent and top six mantissa bits (LATE_BITS in C and
-- engine.policy): frexp's m is in [0.5, 1), so (m - 0.5) * 128 (exact) holds them. Its order is
-- C's late_q, which reads the same bits (offset by a constant).
local function late_weigh(pass, h)
  local late = pass.now - h.dues[h.at]
  if late < 0 then late = 0 end
  local s = h.w * late / h.ivs[h.at]
  if s > 0 then
    local m, e = math.frexp(s)
    h.q = e * 64 + math.floor((m - 0.5) * 128)
  else
    h.q = -math.huge
  end
end

-- The next `remaining` grants: one pick at a time of the lane whose head has the highest
-- quantum of weight * (now - due) / interval (ties to the lower lane), each as its lane's heads
-- and the index of the row in them. A picked lane's next head is read when there is a next
-- pick.
local function late_picks(pass, live)
  for _, h in ipairs(live) do late_weigh(pass, h) end
  local picks, idx, n = cleared(S_PICKS), cleared(S_IDX), pass.remaining
  for p = 1, n do
    local best, bq
    for i = 1, #live do -- in lane order: a later lane wins only when it is higher
      local h = live[i]
      if not best or h.q > bq then best, bq = h, h.q end
    end
    if not best then break end
    picks[p], idx[p] = best, best.at
    best.at = best.at + 1
    if p < n then
      if best.at <= best.read or late_refill(pass, best, math.ceil((n - p) / 2)) then
        late_weigh(pass, best)
      else
        for i = 1, #live do
          if live[i] == best then table.remove(live, i); break end
        end
      end
    end
  end
  return picks, idx
end

-- 4. The remainder by lateness, lanes from `first` on: the rows late_picks chose, granted in
-- the order they were picked (the rows late_heads and late_refill read: no second seek).
local function remainder_lateness(pass, first)
  if pass.remaining <= 0 then return end
  local picks, idx = late_picks(pass, late_heads(pass, first))
  local members, keys, lanes = pass.members, pass.keys, pass.lanes
  local taken, grants = pass.taken, pass.grants
  local at = #members
  for k, h in ipairs(picks) do
    local l, i = h.lane, idx[k]
    at = at + 1
    members[at], keys[at], lanes[at] = h.ms[i], h.keys[i], l
    taken[l] = taken[l] + 1
    grants[l] = grants[l] + 1
  end
  pass.remaining = pass.remaining - #picks
end

-- 4. The remainder by global due time, lanes from `first` on: the lateness remainder with every
-- lane weighing 1 and every interval 1 s, so a head weighs now - due, in quanta of a 64th as in
-- C and reference_pass, ties to the lower lane.
local function remainder_edf(pass, first)
  pass.unit = true
  remainder_lateness(pass, first)
end

-- The batch leased: its rows out of ready, a holder entry per row and the batch's record, its
-- lease entry, the token counter and the granted lanes' counters (fields of meta appended to
-- `meta`, the caller's one HSET). Returns the batch's first token.
local function batch_lease(pass, clock, lease_ms, owner, meta)
  local K, P, members, keys = pass.K, pass.P, pass.members, pass.keys
  local n = #members
  chunked('ZREM', K[1], members)
  local first = next_tokens(P, n, clock)
  meta[#meta + 1] = 'token'
  meta[#meta + 1] = fmt(P.token)
  local exp = fmt(clamp(pass.now + lease_ms))
  local h = cleared(S_HOLD)
  local texts = token_texts(first, n)
  local batch = texts[1] -- the batch's id: its first token
  local mid = ':' .. batch .. ':' .. fmt(n) .. ':' .. exp .. ':' -- token:batch:n:expiry:key:owner
  local tail = ':' .. owner
  for i = 1, n do
    h[2 * i - 1] = members[i]
    h[2 * i] = texts[i] .. mid .. keys[i] .. tail
  end
  h[2 * n + 1] = batch_field(batch)
  h[2 * n + 2] = fmt(n) .. ':' .. table.concat(members)
  rcall('ZADD', K[2], exp, batch)
  chunked('HSET', K[5], h)
  -- the granted lanes' counters: read with one HMGET, written with the credits' HSET
  -- (measured: cheaper than an HINCRBY per lane, and than reading them with the meta)
  local fields = {}
  for l = 0, pass.nl - 1 do
    if pass.grants[l] > 0 then fields[#fields + 1] = l end
  end
  local names = {}
  for i, l in ipairs(fields) do names[i] = 'g' .. l end
  local was = rcall('HMGET', K[4], unpack(names))
  for i, l in ipairs(fields) do
    meta[#meta + 1] = names[i]
    meta[#meta + 1] = fmt((tonumber(was[i]) or 0) + pass.grants[l])
  end
  return first
end

-- 5. What a floor class got from the remainder counts against its credit (down to 0); the
-- credits that moved, the batch's leases and the counters are written, with one HSET of meta.
-- Returns the batch's first token (0: none), members and keys (texts), in grant order.
local function commit(pass, clock, lease_ms, owner)
  local P, cred, meta = pass.P, pass.cred, {}
  if cred then
    for cls = 1, 3 do
      if P.shares[cls] > 0 then
        local extra = 0
        for _, l in ipairs(pass.lanes_of[cls]) do
          extra = extra + pass.grants[l] - pass.before[l]
        end
        if extra > 0 and cred[cls] > 0 then cred[cls] = math.max(0, cred[cls] - extra * ONE) end
      end
    end
    for i = 0, 3 do
      if cred[i] ~= P.credits[i] then
        meta[#meta + 1] = 'c' .. i
        meta[#meta + 1] = fmt(cred[i])
        P.credits[i] = cred[i]
      end
    end
  end
  local first = 0
  if #pass.members > 0 then first = batch_lease(pass, clock, lease_ms, owner, meta) end
  if #meta > 0 then rcall('HSET', pass.K[4], unpack(meta)) end
  return first, pass.members, pass.keys
end

local function claim_pass(K, P, now, clock, budget, lease_ms, window, owner)
  local pass = pass_open(K, P, now, budget, window)
  if not P.on then
    lane_order(pass, 0)
    return commit(pass, clock, lease_ms, owner)
  end
  local cred = {}
  for i = 0, 3 do cred[i] = P.credits[i] end
  local capped = P.urgent < ONE
  pass.cred, pass.lanes_of = cred, class_lanes(P, pass.nl)
  accrue(pass, capped)
  if capped then urgent_cap(pass) end
  floors(pass)
  local before = {}
  for l = 0, pass.nl - 1 do before[l] = pass.grants[l] end
  pass.before = before
  local first = capped and 1 or 0 -- a capped urgent lane takes no more than its credit
  if P.rem == 0 then
    lane_order(pass, first)
  elseif P.rem == 2 then
    remainder_lateness(pass, first)
  else
    remainder_edf(pass, first)
  end
  return commit(pass, clock, lease_ms, owner)
end
