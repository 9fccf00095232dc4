-- A row made due now (lanes_prioritize, and lanes_add_urls for a parked row).
--- @include "base"
--- @include "queue"
--- @include "records"
--- @include "holder"

-- Make `row` due at `now`: urgent (lane 0) with `rush`, else in its own lane, urgency cleared.
-- A row in flight keeps its lease; the new key waits in its holder entry.
local function prioritize_row(K, P, now, row, rush)
  check_row(K, P, row)
  local r = get(K, row)
  if not has(r.flags, F_LIVE) then fail('VALUE', 'row ' .. row .. ' was removed') end
  local discovered = has(r.flags, F_DISCOVERED)
  r.flags = F_LIVE + (discovered and F_DISCOVERED or 0) + (rush and F_URGENT or 0)
  local _, h = where(K, mem(row)) -- in flight: its key waits in the holder entry
  reschedule(K, P, row, r, lane_for(P, discovered, r.interval, r.failures, rush), now, h)
  return 1
end

--[[ The records of rows nums[1..n] (numbers) as u48s (see `record`), into `out`. Rows are
counted per BUCKET of row ids; a bucket holding DENSE of them or more is read whole with one
GETRANGE (6 KB) and decoded with string.byte, the rest with one BITFIELD_RO per CHUNK. A
scope's rows come in URL order, and rows added together (a sitemap, a path's pages) lie close:
most of a page falls in a few buckets, where BITFIELD_RO costs three arguments a row, one a
number Redis formats with %.17g (bench/profile_recache.py: a scope costs the server 0.87x the
instructions). Rows spread thin over a big table cost what BITFIELD_RO costs. ]]
local BUCKET, DENSE = 1024, 4
local S_SPARSE, S_GETS = {}, {}
local function records_of(K, nums, out)
  local count = {} -- per bucket (keyed by its first row id), how many rows
  for k = 1, #nums do
    local r = nums[k]
    local b = r - r % BUCKET
    count[b] = (count[b] or 0) + 1
  end
  local spans = {}
  for b, c in pairs(count) do
    if c >= DENSE then
      spans[b] = rcall('GETRANGE', K[3], fmt(b * RECLEN), fmt((b + BUCKET) * RECLEN - 1))
    end
  end
  local sparse, byte = cleared(S_SPARSE), string.byte
  for k = 1, #nums do
    local r = nums[k]
    local b = r - r % BUCKET
    local span = spans[b]
    if span then
      local o = (r - b) * RECLEN
      local x1, x2, x3, x4, x5, x6 = byte(span, o + 1, o + RECLEN)
      out[k] = (((x1 * 256 + x2) * 256 + x3) * 256 + x4) * 65536 + x5 * 256 + x6
    else
      sparse[#sparse + 1] = k
    end
  end
  for i = 1, #sparse, CHUNK do
    local j, gets = math.min(i + CHUNK - 1, #sparse), cleared(S_GETS)
    for q = i, j do
      gets[3 * (q - i) + 1], gets[3 * (q - i) + 2], gets[3 * (q - i) + 3] = 'GET', 'u48',
        nums[sparse[q]] * RECLEN * 8
    end
    local got = rcall('BITFIELD_RO', K[3], unpack(gets))
    for q = i, j do out[sparse[q]] = got[q - i + 1] end
  end
  return out
end

--[[ prioritize_row on each live row of `rows` (members, 8 digits, checked with check_members
first: any row out of range and nothing changes), a removed row skipped; returns how many were
made due. The same writes as the loop of prioritize_row, in a few calls per CHUNK rows instead
of six calls a row (a scope of a million rows: docs/figures.md): the records read at once
(records_of), one BITFIELD writes the flags that change, one ZADD XX moves the rows waiting in
ready (the rows in flight, rare, are found when it changed fewer, and rekeyed in their holder
entries one by one); the lanes' bounds are widened once for the whole call. A row named twice
is counted twice, as the loop counts it (the second time writes what the first wrote). ]]
local S_NUMS, S_RECS, S_MOVE, S_SETS = {}, {}, {}, {} -- prioritize_rows
local function prioritize_rows(K, P, now, rows, rush)
  check_members(P, rows)
  local nums = cleared(S_NUMS)
  for k = 1, #rows do nums[k] = tonumber(rows[k]) end
  local recs = records_of(K, nums, cleared(S_RECS))
  local urgent = rush and F_URGENT or 0
  -- Per record without its urgency and liveness (all a lane depends on): the lane; per lane its
  -- key, formatted once. A scope's rows share a few intervals, so most rows cost no lane_for.
  local done, top, seen, lanes, keys = 0, -1, {}, {}, {}
  for i = 1, #rows, CHUNK do
    local j = math.min(i + CHUNK - 1, #rows)
    local move, sets, m, s = cleared(S_MOVE), cleared(S_SETS), 0, 0
    for k = i, j do
      local v = recs[k]
      local flags = v % 256
      if flags % 8 >= F_LIVE then
        local discovered = flags % 2
        local lane = lanes[v - flags + discovered]
        if not lane then
          local interval, failures = math.floor(v / 65536), math.floor(v / 256) % 256
          lane = lane_for(P, discovered == 1, interval, failures, rush)
          lanes[v - flags + discovered] = lane
          seen_add(seen, lane, interval)
          if not keys[lane] then keys[lane] = fmt(key_of(lane, now)) end
          if lane > top then top = lane end
        end
        local to = F_LIVE + discovered + urgent
        if to ~= flags then -- the flags byte, the record's last
          sets[s + 1], sets[s + 2], sets[s + 3], sets[s + 4] = 'SET', 'u8',
            nums[k] * RECLEN * 8 + 40, to
          s = s + 4
        end
        move[m + 1], move[m + 2] = keys[lane], rows[k]
        m = m + 2
        done = done + 1
      end
    end
    if s > 0 then rcall('BITFIELD', K[3], unpack(sets, 1, s)) end
    if m > 0 and rcall('ZADD', K[1], 'XX', 'CH', unpack(move, 1, m)) < m / 2 then
      -- Not all were waiting in ready (or some were due at that key already): each one that
      -- is not there now is in flight, and its key waits in its holder entry.
      local members = {}
      for k = 2, m, 2 do members[#members + 1] = move[k] end
      local scores = rcall('ZMSCORE', K[1], unpack(members))
      for k = 1, #members do
        if not scores[k] then
          local h = holding(rcall('HGET', K[5], members[k]))
          if h then
            rcall('HSET', K[5], members[k], rekeyed(h, tonumber(move[2 * k - 1])))
          else
            rcall('ZADD', K[1], move[2 * k - 1], members[k])
          end
        end
      end
    end
  end
  if top >= 0 then note_lane(K, P, top) end
  note_bounds(K, P, seen)
  return done
end
