-- Leases: a token checked against its row's holder entry, the end of a batch's leases (rows
-- back into ready, batches dropped), and the put-back of lapsed batches.
--- @include "base"
--- @include "holder"

local S_LIVE = {} -- live_leases

-- The holding of a row (member m) whose lease `token` still holds, else nil (a stale token).
-- A lapsed lease holds until the row is granted again (that overwrites the holder entry).
local function leased(K, m, token)
  local v = rcall('HGET', K[5], m)
  local h = holding(v)
  if token == 0 or not h or h.token ~= token then return nil end
  h.value = v
  return h
end

--[[ Batches: a redis.call costs about as much as the work of a small command (argument and
reply conversion; ~1-2 us on a slow core), so a batch of n leases reads every holder entry
with one HMGET, every record it needs with one BITFIELD_RO, and ends the leases with one HDEL
and one ZADD (and one ZREM of the lease entries of the batches whose last row ended), instead
of several calls per row. A token's validity does not depend on the clock, so no expiry is
read. A row listed twice in one batch is stale the second time (its lease ended with the
first). ]]

-- Members and tokens are the client's strings (a token with the ':' that ends it in a holder
-- entry), compared and passed on as they are: a number handed to redis.call is formatted
-- again, and that costs more than the call.
local function live_leases(K, rows, tokens)
  local out = cleared(S_LIVE)
  if #rows == 0 then return out end
  local held = per_row('HMGET', K[5], rows)
  local ended = {}
  for i = 1, #rows do
    local v, t = held[i], tokens[i]
    local ok = v and t ~= '0:' and string.find(v, t, 1, true) == 1 and not ended[rows[i]]
    if ok then ended[rows[i]] = true end
    out[i] = ok and v or false
  end
  return out
end

-- Count `c` more ended rows against each batch of `ends` (batch -> c): a batch whose every row
-- has ended loses its lease entry and its record (its field goes into `hdel`, the caller's one
-- HDEL); one that keeps rows in flight gets its count lowered. A call that ends all n rows of
-- a batch (n from the rows' holder entries, `sizes`) needs no read of its record; a batch that
-- lapsed has none left, and nothing is done for it.
local function batches_end(K, ends, sizes, hdel)
  local gone, partial = {}, {}
  for b, c in pairs(ends) do
    if c == sizes[b] then gone[#gone + 1] = b else partial[#partial + 1] = b end
  end
  if #partial > 0 then
    local names = {}
    for i, b in ipairs(partial) do names[i] = batch_field(b) end
    local recs = per_row('HMGET', K[5], names)
    for i, b in ipairs(partial) do
      if recs[i] then
        local count, rest = string.match(recs[i], '^(%d+)(:%d*)$')
        local left = tonumber(count) - ends[b]
        if left <= 0 then
          gone[#gone + 1] = b
        else
          rcall('HSET', K[5], names[i], fmt(left) .. rest)
        end
      end
    end
  end
  if #gone == 0 then return end
  for _, b in ipairs(gone) do hdel[#hdel + 1] = batch_field(b) end
  chunked('ZREM', K[2], gone)
end

-- End the leases of `ended` (members; `helds` their holder entries) and put `back` (score,
-- member pairs) into ready: the batched tail. `ended` gets the fields of the batches that end
-- with them appended.
local function leases_end(K, ended, helds, back)
  if #ended == 0 then return end
  local ends, sizes = {}, {}
  for i = 1, #ended do
    local b, n = string.match(helds[i], '^%d+:(%d+):(%d+):')
    local c = ends[b]
    if not c then
      c = 0
      sizes[b] = tonumber(n)
    end
    ends[b] = c + 1
  end
  batches_end(K, ends, sizes, ended)
  chunked('HDEL', K[5], ended)
  if #back > 0 then chunked('ZADD', K[1], back) end
end

-- The rows still held under `batches` (members of lease), as members, holdings and how many
-- of the batches they come from: each batch's record lists the rows it was granted; those
-- whose holder entry still names it are held. With `limit`, the batches from the first on
-- until their rows reach it (one at least).
local function batch_rows(K, batches, limit)
  local ms, holds = {}, {}
  if #batches == 0 then return ms, holds, 0 end
  local names = {}
  for i, b in ipairs(batches) do names[i] = batch_field(b) end
  local recs = per_row('HMGET', K[5], names)
  local rows, of = {}, {}
  local upto = 0
  for i = 1, #batches do
    if limit and #rows >= limit then break end
    local list = recs[i] and string.match(recs[i], '^%d+:(%d*)$') or ''
    for k = 1, #list, 8 do
      rows[#rows + 1] = string.sub(list, k, k + 7)
      of[#of + 1] = batches[i]
    end
    upto = i
  end
  local held = #rows > 0 and per_row('HMGET', K[5], rows) or {}
  for i = 1, #rows do
    local h = holding(held[i])
    if h and h.batch == of[i] then
      ms[#ms + 1] = rows[i]
      holds[#holds + 1] = h
    end
  end
  return ms, holds, upto
end

-- Put the rows of lapsed batches (expiry <= now) back into ready with the key their holder
-- entries keep, and drop the batches' lease entries and records: up to EXPIRE_BATCH batches,
-- fewer once their rows reach EXPIRE_ROWS (a batch is put back whole), the rest by the next
-- passes. The holder entries stay: a holder may still end its lease until the row is granted
-- again.
local function expire(K, now)
  local lapsed = rcall('ZRANGE', K[2], '-inf', fmt(now), 'BYSCORE', 'LIMIT', 0, EXPIRE_BATCH)
  if #lapsed == 0 then return 0 end
  local ms, holds, upto = batch_rows(K, lapsed, EXPIRE_ROWS)
  local back, gone, names = {}, {}, {}
  for i = 1, #ms do
    back[#back + 1] = fmt(holds[i].key)
    back[#back + 1] = ms[i]
  end
  for i = 1, upto do
    gone[i] = lapsed[i]
    names[i] = batch_field(lapsed[i])
  end
  chunked('ZREM', K[2], gone)
  chunked('HDEL', K[5], names)
  if #back > 0 then chunked('ZADD', K[1], back) end
  return upto
end
