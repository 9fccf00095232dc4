-- A queue's meta (its counters and policy as `P`), lanes and keys, and the checks of row ids.
--- @include "base"

-- p_edf holds the remainder (its name is from when there were two): 0 lane order, 1 edf, 2
-- lateness (engine.policy REMAINDERS, in that order); a queue written before lateness holds 0
-- or 1, which mean what they meant. p_w: lateness's lane weights in ONE fixed point, comma
-- separated from lane 0 on; absent or empty, or past its end, a lane weighs ONE; 'intervals':
-- derived from the lanes' interval bounds (v<lane> = 'lo:hi', only ever widened: note_bounds),
-- kept in p_lw as p_w would hold them and derived again whenever a bound or the policy moves.
local function weights_of(text)
  local w, lane = {}, 0
  for x in string.gmatch(text or '', '%d+') do
    w[lane] = tonumber(x)
    lane = lane + 1
  end
  return w
end

local META = {'layout', 'next_row', 'p_on', 'p_bands', 'p_cold', 'p_urgent', 'p_s1', 'p_s2',
  'p_s3', 'p_edf', 'lanes_high', 'token', 'c0', 'c1', 'c2', 'c3', 'p_w', 'p_lw'}
local SPREAD_EXPONENT = 3 / 16 -- engine.policy.SPREAD_EXPONENT, FIRST_BAND_WEIGHT, WEIGHT_MAX
local FIRST_BAND_WEIGHT = 4
local WEIGHT_MAX = 65536000

local function queue_meta(K)
  local v = rcall('HMGET', K[4], unpack(META))
  if not v[1] then fail('MISSING', 'no queue at ' .. K[4]) end
  if v[1] ~= LAYOUT then fail('LAYOUT', 'queue layout ' .. v[1] .. ', library ' .. LAYOUT) end
  local bands = {}
  for b in string.gmatch(v[4] or '', '%d+') do bands[#bands + 1] = tonumber(b) end
  local bpc = #bands + 1
  return {
    next_row = tonumber(v[2]), on = v[3] == '1', bands = bands, bpc = bpc,
    lane_count = 2 * bpc + 2, cold_after = tonumber(v[5]), urgent = tonumber(v[6]),
    shares = {tonumber(v[7]), tonumber(v[8]), tonumber(v[9])}, rem = tonumber(v[10]) or 0,
    live = v[17] == 'intervals',
    weights = weights_of(v[17] == 'intervals' and v[18] or v[17]),
    lanes_high = tonumber(v[11]), token = tonumber(v[12]),
    credits = {[0] = tonumber(v[13]) or 0, tonumber(v[14]) or 0, tonumber(v[15]) or 0,
               tonumber(v[16]) or 0},
  }
end

local function lane_for(P, discovered, interval, failures, urgent)
  if not P.on or urgent then return 0 end
  if failures >= P.cold_after then return P.lane_count - 1 end
  local band = 0 -- bisect_left: bands strictly below the interval
  while band < #P.bands and P.bands[band + 1] < interval do band = band + 1 end
  return (discovered and 1 + P.bpc or 1) + band
end

-- Class of a lane: 0 urgent, 1 submitted, 2 discovered, 3 cold (and lanes past the layout).
local function class_of(P, lane)
  if lane == 0 then return 0 end
  if lane <= P.bpc then return 1 end
  if lane <= 2 * P.bpc then return 2 end
  return 3
end

local function check_row(K, P, row)
  if row == nil or row ~= math.floor(row) or row < 0 or row >= P.next_row then
    fail('RANGE', 'row ' .. tostring(row) .. ' does not exist')
  end
end

-- check_row of members (8 digits each, as rows_tokens checked): compared as strings, which
-- order as the numbers do at one length, with no number parsed per row.
local function check_members(P, rows)
  local top = mem(P.next_row)
  for i = 1, #rows do
    if rows[i] >= top then fail('RANGE', 'row ' .. tonumber(rows[i]) .. ' does not exist') end
  end
end

local function key_of(lane, due)
  return lane * STRIDE + due
end

-- (lane, due) of a key.
local function split(key)
  local lane = math.floor(key / STRIDE)
  return lane, key - lane * STRIDE
end

local function note_lane(K, P, lane)
  if lane > P.lanes_high then
    P.lanes_high = lane
    rcall('HSET', K[4], 'lanes_high', lane)
  end
end

-- The weights 'intervals' derives (engine.policy.interval_weights_fp), stored in p_lw: each
-- submitted or discovered lane that held a row weighs (hi / lo) ^ (3/16) in ONE fixed point
-- (rounded half up, one libm pow as C and Python), times 4 when it holds the shortest interval
-- of those lanes; urgent, cold and the lanes that never held a row weigh ONE.
local function derive_weights(K, P)
  local last, names = 2 * P.bpc, {}
  for l = 1, last do names[l] = 'v' .. l end
  local v = rcall('HMGET', K[4], unpack(names))
  local lo, hi, shortest = {}, {}, nil
  for l = 1, last do
    local a, b = string.match(v[l] or '', '^(%d+):(%d+)$')
    if a then
      lo[l], hi[l] = math.max(1, tonumber(a)), tonumber(b)
      if not shortest or lo[l] < shortest then shortest = lo[l] end
    end
  end
  local w = {}
  for l = 0, last do
    local x = ONE
    if lo[l] then
      x = math.floor((hi[l] / lo[l]) ^ SPREAD_EXPONENT * ONE + 0.5)
      if lo[l] == shortest then x = x * FIRST_BAND_WEIGHT end
      x = math.min(x, WEIGHT_MAX)
    end
    w[l + 1] = string.format('%d', x)
  end
  local text = table.concat(w, ',')
  rcall('HSET', K[4], 'p_lw', text)
  if P.live then P.weights = weights_of(text) end
end

-- The lanes rows were just placed in, with their intervals (seen[lane] = {lo, hi}): each lane's
-- bounds are widened to take them (csrc/layout.h rl_lane_iv_note: only ever outward), and the
-- derived weights follow when one moved.
local function note_bounds(K, P, seen)
  local lanes, names = {}, {}
  for lane in pairs(seen) do
    lanes[#lanes + 1] = lane
    names[#names + 1] = 'v' .. lane
  end
  if #lanes == 0 then return end
  local was = rcall('HMGET', K[4], unpack(names))
  local out = {}
  for i, lane in ipairs(lanes) do
    local lo, hi = seen[lane][1], seen[lane][2]
    local a, b = string.match(was[i] or '', '^(%d+):(%d+)$')
    a, b = tonumber(a), tonumber(b)
    if not a or lo < a or hi > b then
      if a then lo, hi = math.min(lo, a), math.max(hi, b) end
      out[#out + 1] = names[i]
      out[#out + 1] = string.format('%d:%d', lo, hi)
    end
  end
  if #out == 0 then return end
  rcall('HSET', K[4], unpack(out))
  derive_weights(K, P)
end

-- seen[lane] widened to take interval iv (0 counts as 1 s, as in C).
local function seen_add(seen, lane, iv)
  if iv < 1 then iv = 1 end
  local b = seen[lane]
  if not b then
    seen[lane] = {iv, iv}
  elseif iv < b[1] then
    b[1] = iv
  elseif iv > b[2] then
    b[2] = iv
  end
end

local function clamp(ms)
  if ms > HORIZON then return HORIZON end
  return ms
end
