-- A queue's meta (its counters and policy as `P`), lanes and keys, and the checks of row ids.
--- @include "base"

-- p_edf holds the remainder (its name is from when there were two): 0 lane order, 1 edf, 2
-- lateness (engine.policy REMAINDERS, in that order); a queue written before lateness holds 0
-- or 1, which mean what they meant. p_w: lateness's lane weights in ONE fixed point, comma
-- separated from lane 0 on; absent or empty, or past its end, a lane weighs ONE.
local function weights_of(text)
  local w, lane = {}, 0
  for x in string.gmatch(text or '', '%d+') do
    w[lane] = tonumber(x)
    lane = lane + 1
  end
  return w
end

local META = {'layout', 'next_row', 'p_on', 'p_bands', 'p_cold', 'p_urgent', 'p_s1', 'p_s2',
  'p_s3', 'p_edf', 'lanes_high', 'token', 'c0', 'c1', 'c2', 'c3', 'p_w'}

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
    weights = weights_of(v[17]),
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

local function clamp(ms)
  if ms > HORIZON then return HORIZON end
  return ms
end
