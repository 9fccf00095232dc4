-- Holder entries (a row in flight: its token, batch, expiry, key, owner), and where a live row
-- is now.
--- @include "base"
--- @include "queue"
--- @include "records"


-- A row's holder entry: the lease's token, its batch, the batch's size, its expiry, the key the
-- row goes back with (all exact decimal strings), the owner id.
local function holder_value(token, batch, n, expiry, key, owner)
  return token .. ':' .. batch .. ':' .. n .. ':' .. expiry .. ':' .. key .. ':' .. owner
end

local HOLDING = '^(%d+):(%d+):(%d+):(%d+):(%d+):(.*)$'

-- The holding of a holder entry (nil: no entry): token, key and expiry as numbers, batch (a
-- member of lease) and the rest as strings.
local function holding(v)
  if not v then return nil end
  local token, batch, n, expiry, key, owner = string.match(v, HOLDING)
  return {token = tonumber(token), batch = batch, n = tonumber(n), expiry = tonumber(expiry),
          key = tonumber(key), owner = owner}
end

-- The entry of holding h with another key (a prioritize of a row in flight).
local function rekeyed(h, key)
  return holder_value(fmt(h.token), h.batch, fmt(h.n), fmt(h.expiry), fmt(key), h.owner)
end

local function batch_field(batch) -- a batch's record in holder (never a row's 8 digits)
  return 'b' .. batch
end

-- The key of a live row (member m) where it is now, and its holding while it is in flight: the
-- ready score (a holder entry of a row in ready is a lapsed lease's, its key void), or the key
-- its holder entry keeps.
local function where(K, m)
  local z = rcall('ZSCORE', K[1], m)
  if z then return tonumber(z), nil end
  local h = holding(rcall('HGET', K[5], m))
  if h then return h.key, h end
  return nil, nil
end

-- Store a row's new record and key: the key goes to ready (claimable at once), or, when the row
-- is in flight (`h` its holding), into its holder entry, for the end of its lease to put back.
local function reschedule(K, P, row, r, lane, due, h)
  put(K, row, r)
  note_lane(K, P, lane)
  local seen = {}
  seen_add(seen, lane, r.interval)
  note_bounds(K, P, seen)
  if h then
    rcall('HSET', K[5], mem(row), rekeyed(h, key_of(lane, due)))
  else
    rcall('ZADD', K[1], fmt(key_of(lane, due)), mem(row))
  end
end
