-- Row records (REC) in the row table: one read or write, or a batch's reads in one call.
--- @include "base"

local function get(K, row)
  local s = rcall('GETRANGE', K[3], fmt(row * RECLEN), fmt(row * RECLEN + RECLEN - 1))
  local interval, failures, flags = struct.unpack(REC, s)
  return {interval = interval, failures = failures, flags = flags}
end

local function put(K, row, r)
  rcall('SETRANGE', K[3], fmt(row * RECLEN), struct.pack(REC, r.interval, r.failures, r.flags))
end

-- The records of rows[1..n] (members), each as its u48 (see `record`: no table per row), with
-- one BITFIELD_RO per CHUNK (BITFIELD's '#n' offset refuses leading zeros, so a member goes as
-- its digits from the first nonzero one, cut out of the string: no number conversion). The
-- argument table is kept and reused, as building it per call costs more than the call.
local GETS = {}
local function get_many(K, rows)
  local out = {}
  for i = 1, #rows, CHUNK do
    local j = math.min(i + CHUNK - 1, #rows)
    local a = 0
    for k = i, j do
      GETS[a + 1] = 'GET'
      GETS[a + 2] = 'u48'
      GETS[a + 3] = '#' .. string.match(rows[k], '^0*(%d+)$')
      a = a + 3
    end
    local got = rcall('BITFIELD_RO', K[3], unpack(GETS, 1, a))
    for k = 1, #got do out[i + k - 1] = got[k] end
  end
  return out
end

-- The interval of a record read as one u48 (get_many), alone: a lateness pass reads many.
local function interval_of(v)
  return math.floor(v / 65536)
end

-- interval, failures, flags of a record read as one u48 (get_many): no table per row.
local function record(v)
  return math.floor(v / 65536), math.floor(v / 256) % 256, v % 256
end
