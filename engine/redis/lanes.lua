#!lua name=render_lanes
--[[
render-lanes on Redis: every write and every claim pass of one queue is one FCALL into this
library, so each runs atomically on the server (Redis runs one function at a time).

Keys of one queue (all carry the hash tag {name}, so a queue is one Cluster slot), always passed
in this order as KEYS[1..5]:

  ready   ZSET  member = row id, score = key = lane * 2^42 + due_ms: rows waiting to be claimed
  lease   ZSET  member = batch id (the first token of a claim's batch, or a renew's token),
                score = lease expiry (ms): the batches in flight, one entry per claim
  rows    STRING  the row table: a fixed 6-byte record per row id at offset row * 6
  meta    HASH  layout, counters (next_row, token), the policy, share credits, per-lane grants
  holder  HASH  member = row id, value = 'token:batch:n:expiry:key:owner': rows in flight, and
                rows whose lease lapsed and that nobody was granted since (their token still
                holds); and per batch in flight, field 'b<batch>', value = 'count:members' (how
                many of its rows are still held under it, then the members it was granted)

A row is in exactly one of ready and a batch in flight while it is live (in flight: its holder
entry names a batch in lease and it is not in ready); a removed row is in neither. A claimed row
leaves ready, so a claim pass never reads a row in flight, and comes back (with the key its
holder entry keeps) when its lease is completed, failed, released, or lapses: the first step of
every claim pass moves the rows of lapsed batches back.

Layout 4 leases a batch, not a row: a claim adds one lease entry (its batch) where layout 3
added one per row, and the end of a batch's last row (or its lapse) removes it, so a row goes
through five member operations a cycle (ZREM ready, HSET holder; HMGET holder, HDEL holder, ZADD
ready), not seven. A row's holder entry carries its batch, the batch's size n (a call that ends
n rows of one batch ends the batch without reading its record) and the expiry (fixed for the
batch's life: a renew moves the row to a batch of its own), so describe and stats read a row's
lease from its entry alone. A row's key (lane and due time) lives in exactly one place, the
ready score while it waits, its holder entry while it is in flight; its fencing token only in
its holder entry. So a claim writes nothing per row but one field of one variadic HSET, and a
complete reads the batch's records with one BITFIELD_RO and writes a record only to clear
failures or urgency.

A token is valid while the row's holder entry holds it, as in shared memory (API.md: stale
means the lease expired AND the row was claimed again, or the lease ended): an expired lease
nobody has claimed again can still be completed, failed, released or renewed by its holder.
So the expiry step puts a lapsed batch's rows back into ready (claimable) but leaves their
holder entries; the next grant of a row overwrites its entry, a write that ends the lease
deletes it. The key and expiry of such an entry mean nothing (the ready score is the row's key,
its batch is gone); its token and owner do.

A row's member (in ready and holder) is the row id in 8 zero-padded digits (MEMBER): a ZSET
orders equal scores by member bytes, and padded ids sort as numbers, so rows due at the same
millisecond are served in row order, as by the shared-memory engine ("10" would precede "9").
Batch calls take their row ids as members from the client (engine.py ``member``), so no row id
is formatted here on the hot path.

Record (big endian, so that BITFIELD reads it as one u48; struct format REC):
  interval_s I4 | failures B | flags B
flags: 1 = discovered (else submitted), 2 = urgent, 4 = live (not removed).
Tokens: a claim's tokens are max(counter, server clock ms * 1024) + 1, + 2, ... and the counter
`token` in meta moves past them, so they never repeat within a queue, and neither across a lost
second of writes (the counter rolled back, the clock not) while fewer than 1024 are issued per
millisecond. Every number stays below 2^53 (exact as a Lua number and as a ZSET score).

Nothing from ARGV is ever evaluated: ARGV holds numbers and an owner string, nothing else.
Every function checks ARGV[1] against VERSION, so a client built for another version of this
library gets a clear error instead of a silent misreading.
]]

local VERSION = '9'
local LAYOUT = '4' -- bump with any change to a key's or a record's meaning (engine.py too)
local STRIDE = 4398046511104 -- 2^42
local HORIZON = STRIDE - 1
local ONE = 65536 -- share credit unit (engine.policy.ONE)
local REC = '>I4BB'
local RECLEN = 6 -- bytes: BITFIELD's u48, so 'GET u48 #row' reads row's record
local TOKEN_SEED = 1024 -- tokens per millisecond of the server clock (see the note above)
local F_DISCOVERED, F_URGENT, F_LIVE = 1, 2, 4
local EXPIRE_BATCH = 100 -- lapsed batches put back per claim pass (the rest by the next ones),
local EXPIRE_ROWS = 1000 -- and no more batches once their rows reach this (one at least)
local CHUNK = 1000 -- members per variadic call (unpack() has a C stack limit)
local MEMBER = '%08d' -- a row id as a member: sorts as a number (MAX_ROWS < 10^8)

-- The standard functions this library uses, as upvalues under their usual names. A global is
-- resolved through the sandbox's metatable (several table reads a use; a cycle makes hundreds:
-- measured with callgrind, 3 % of a cycle's instructions went there). They are not
-- there while the library loads (nor is redis.call), so `bind` copies them in on the first call
-- of any registered function (see register); the code below reads as if they were globals.
local function standard()
  return redis.call, string, math, table, struct, tonumber, tostring, unpack, ipairs, pairs,
    error, select
end
local rcall, string, math, table, struct, tonumber, tostring, unpack, ipairs, pairs, error, select
local function bind()
  rcall, string, math, table, struct, tonumber, tostring, unpack, ipairs, pairs, error, select =
    standard()
end

-- Numbers go to Redis as exact integers, never as %.14g. '%d' (a C long: every number here is
-- an integer below 2^53) costs half of '%.0f', whose libc path is multi-precision.
local function fmt(x)
  return string.format('%d', x)
end

local function mem(row) -- a row id as a member of ready and holder
  return string.format(MEMBER, row)
end

local function fail(code, text)
  return error({err = code .. ' ' .. text})
end

local function has(flags, bit)
  return flags % (bit * 2) >= bit
end

local function check_version(argv)
  if argv[1] ~= VERSION then
    fail('VERSION', 'library render_lanes is version ' .. VERSION .. ', the client needs '
      .. tostring(argv[1]))
  end
end

local function clock_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function now_of(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  return clock_ms()
end

-- (now, the server clock): the clock seeds tokens even when the caller's time is virtual.
local function times(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg), clock_ms() end
  local now = clock_ms()
  return now, now
end

-- Reserve n tokens: they follow the counter and the server clock, whichever is further.
local function next_tokens(P, n, clock)
  local first = math.max(P.token, clock * TOKEN_SEED) + 1
  P.token = first + n - 1
  return first
end

-- Variadic commands in chunks: cmd(key, prefix..., items[i..j]...).
local function chunked(cmd, key, items)
  for i = 1, #items, CHUNK do
    local j = math.min(i + CHUNK - 1, #items)
    rcall(cmd, key, unpack(items, i, j))
  end
end

-- ---------------------------------------------------------------- queue, rows, policy -----

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

-- interval, failures, flags of a record read as one u48 (get_many): no table per row.
local function record(v)
  return math.floor(v / 65536), math.floor(v / 256) % 256, v % 256
end

-- Scratch tables kept between calls, as GETS is: one grown to a batch's size stays that size,
-- where a new table per call grows one doubling at a time (a realloc and a rehash each; table
-- growth was a fifth of a cycle's instructions). Only for arrays that never leave the call
-- that fills them; `cleared` empties one before use.
local function cleared(t)
  for i = #t, 1, -1 do t[i] = nil end
  return t
end
local S_ROWS, S_TOKENS = {}, {} -- rows_tokens
local S_WHICH, S_OK, S_ENDED, S_HELDS, S_BACK = {}, {}, {}, {}, {} -- complete_many
local S_LANES, S_MEMBERS, S_KEYS, S_HOLD = {}, {}, {}, {} -- claim_pass
local S_BYTES = {} -- f_complete_claim
local S_TEXTS, S_LIVE = {}, {} -- token_texts, live_leases

local function key_of(lane, due)
  return lane * STRIDE + due
end

-- (lane, due) of a key.
local function split(key)
  local lane = math.floor(key / STRIDE)
  return lane, key - lane * STRIDE
end

-- '000' .. '999' (built by concatenation: the string library is not there while the library
-- loads), for token_texts.
local DIGITS3 = {}
for i = 0, 999 do DIGITS3[i] = (i < 10 and '00' or i < 100 and '0' or '') .. i end

-- The decimal strings of the n tokens from `first` on: one format per thousand tokens, each
-- token then its prefix and three digits from DIGITS3 (a format costs more than a concat).
local function token_texts(first, n)
  local out = cleared(S_TEXTS)
  local base, prefix = nil, nil
  for i = 1, n do
    local tok = first + i - 1
    if not base or tok - base >= 1000 then
      base = tok - tok % 1000
      prefix = base > 0 and fmt(base / 1000) or nil
    end
    out[i] = prefix and prefix .. DIGITS3[tok - base] or fmt(tok)
  end
  return out
end

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

local function note_lane(K, P, lane)
  if lane > P.lanes_high then
    P.lanes_high = lane
    rcall('HSET', K[4], 'lanes_high', lane)
  end
end

-- Store a row's new record and key: the key goes to ready (claimable at once), or, when the row
-- is in flight (`h` its holding), into its holder entry, for the end of its lease to put back.
local function reschedule(K, P, row, r, lane, due, h)
  put(K, row, r)
  note_lane(K, P, lane)
  if h then
    rcall('HSET', K[5], mem(row), rekeyed(h, key_of(lane, due)))
  else
    rcall('ZADD', K[1], fmt(key_of(lane, due)), mem(row))
  end
end

local function clamp(ms)
  if ms > HORIZON then return HORIZON end
  return ms
end

-- ---------------------------------------------------------------- leases -----

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

-- Per chunk of rows, one call `cmd key rows...`; the replies joined.
local function per_row(cmd, key, rows)
  if #rows == 0 then return {} end
  if #rows <= CHUNK then return rcall(cmd, key, unpack(rows)) end -- the reply as it is
  local out = {}
  for i = 1, #rows, CHUNK do
    local j = math.min(i + CHUNK - 1, #rows)
    local got = rcall(cmd, key, unpack(rows, i, j))
    for k = 1, #got do out[i + k - 1] = got[k] end
  end
  return out
end

-- The holder entry of each of rows[1..n] (members) whose tokens[i] still holds, else false.
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

-- ---------------------------------------------------------------- the claim pass -----

--[[ One claim pass, exactly as engine.policy.reference_pass:
  1. each share class with a due row accrues share * budget credit, capped at that plus ONE;
  2. urgent (lane 0) takes at most its credit while capped;
  3. each min_share class, its lanes in order, takes up to its credit (a floor);
  4. the remainder in lane order, by global due time (edf), or one grant at a time to the lane
     whose head is latest relative to its interval, times the lane's weight (lateness); what a
     floor class gets from it counts against its credit.
Per lane one seek: ZRANGE ready lane*2^42 lane*2^42+now BYSCORE LIMIT taken n, where `taken`
counts the rows this pass already took from the lane: they leave ready with one ZREM at the
end, so a second seek of a lane skips them. `window` bounds the rows one lane grants in one
pass. Returns the batch's first token (0: none), members and keys (texts), in grant order. ]]
-- Grants from position `start` + 1 on, as the remainder took them lane by lane, put in the
-- order it serves them: by due time, ties to the lower lane, a lane's own order kept (as the
-- shared-memory pass grants with remainder = edf, one global earliest row after another).
-- `cols` are the parallel arrays of the batch (keys and lanes among them), permuted alike.
local function in_due_order(cols, keys, lanes, start)
  local idx, dues = {}, {}
  for i = start + 1, #keys do
    idx[#idx + 1] = i
    dues[i] = tonumber(keys[i]) - lanes[i] * STRIDE
  end
  table.sort(idx, function(a, b)
    if dues[a] ~= dues[b] then return dues[a] < dues[b] end
    if lanes[a] ~= lanes[b] then return lanes[a] < lanes[b] end
    return a < b
  end)
  for _, col in ipairs(cols) do
    local moved = {}
    for k, i in ipairs(idx) do moved[k] = col[i] end
    for k = 1, #idx do col[start + k] = moved[k] end
  end
end

-- Whether a1 * a2 * a3 > b1 * b2 * b3 exactly, for integers below 2^53 whose products are not
-- (a lane head's weight x lateness x the other head's interval reaches 2^100): doubles decide
-- unless the two products are within 1e-12 of each other (a double product of three is within
-- ~5e-16 of the exact one), then base-2^20 limbs decide, as C's 128-bit and Python's integers
-- do.
local LIMB = 1048576
local function limbs(x)
  local t = {}
  for i = 1, 3 do
    t[i] = x % LIMB
    x = math.floor(x / LIMB)
  end
  return t
end
local function limb_mul(a, b)
  local t = {}
  for i = 1, #a + #b do t[i] = 0 end
  for i = 1, #a do
    for j = 1, #b do t[i + j - 1] = t[i + j - 1] + a[i] * b[j] end -- each term < 2^40
  end
  local carry = 0
  for i = 1, #t do
    local v = t[i] + carry
    t[i] = v % LIMB
    carry = math.floor(v / LIMB)
  end
  return t
end
local function product_gt(a1, a2, a3, b1, b2, b3)
  local x, y = a1 * a2 * a3, b1 * b2 * b3
  if x > y * (1 + 1e-12) then return true end
  if x < y * (1 - 1e-12) then return false end
  local p = limb_mul(limb_mul(limbs(a1), limbs(a2)), limbs(a3))
  local q = limb_mul(limb_mul(limbs(b1), limbs(b2)), limbs(b3))
  for i = #p, 1, -1 do
    if p[i] ~= q[i] then return p[i] > q[i] end
  end
  return false
end

local function claim_pass(K, P, now, clock, budget, lease_ms, window, owner)
  local nl = P.lanes_high + 1
  local remaining = budget
  local grants, taken = {}, {}
  -- the batch: a grant's lane, member, key (its text)
  local lanes, members, keys = cleared(S_LANES), cleared(S_MEMBERS), cleared(S_KEYS)
  for l = 0, nl - 1 do grants[l] = 0; taken[l] = 0 end

  local los, his = {}, {} -- a lane's range, formatted once per pass (a lane is sought often)
  local function lo(lane)
    local v = los[lane]
    if not v then v = fmt(lane * STRIDE); los[lane] = v end
    return v
  end
  local function hi(lane)
    local v = his[lane]
    if not v then v = fmt(lane * STRIDE + now); his[lane] = v end
    return v
  end

  local function take(lane, want)
    if lane >= nl then return 0 end -- never written: empty
    local n = math.min(want, remaining, window - taken[lane])
    if n <= 0 then return 0 end
    local got = rcall('ZRANGE', K[1], lo(lane), hi(lane), 'BYSCORE', 'LIMIT', taken[lane], n,
      'WITHSCORES')
    local at = #members
    for i = 1, #got, 2 do -- a key's text (%.17g) is exact below 2^53: no number is parsed
      at = at + 1
      members[at], keys[at], lanes[at] = got[i], got[i + 1], lane
    end
    local k = #got / 2
    taken[lane] = taken[lane] + k
    grants[lane] = grants[lane] + k
    remaining = remaining - k
    return k
  end

  local function has_due(lane)
    return #rcall('ZRANGE', K[1], lo(lane), hi(lane), 'BYSCORE', 'LIMIT', taken[lane], 1) > 0
  end

  local meta = {} -- fields of meta to write back, one HSET
  if not P.on then
    for l = 0, nl - 1 do take(l, remaining) end
  else
    local cred = {}
    for i = 0, 3 do cred[i] = P.credits[i] end
    local capped = P.urgent < ONE
    local lanes_of = {[0] = {}, {}, {}, {}}
    for l = 0, nl - 1 do
      local t = lanes_of[class_of(P, l)]
      t[#t + 1] = l
    end
    -- 1. accrue: urgent while capped (even at share 0: it sheds credit banked under an earlier
    -- policy), the floor classes with a share
    for cls = 0, 3 do
      local fp = cls == 0 and (capped and P.urgent or -1) or P.shares[cls]
      if fp > 0 or (cls == 0 and fp == 0) then
        for _, l in ipairs(lanes_of[cls]) do
          if has_due(l) then
            cred[cls] = math.min(cred[cls] + fp * budget, fp * budget + ONE)
            break
          end
        end
      end
    end
    -- 2. urgent, capped
    if capped then
      local want = math.max(0, math.floor(cred[0] / ONE))
      cred[0] = cred[0] - take(0, want) * ONE
    end
    -- 3. floors
    for cls = 1, 3 do
      if P.shares[cls] > 0 then
        local want = math.max(0, math.floor(cred[cls] / ONE))
        for _, l in ipairs(lanes_of[cls]) do
          local got = take(l, want)
          want = want - got
          cred[cls] = cred[cls] - got * ONE
        end
      end
    end
    -- 4. remainder
    local before = {}
    for l = 0, nl - 1 do before[l] = grants[l] end
    local first = capped and 1 or 0
    -- the due rows the remainder may take next from lane l, with their scores
    local function ahead(l)
      local n = math.min(remaining, window - taken[l])
      if n <= 0 then return {} end
      return rcall('ZRANGE', K[1], lo(l), hi(l), 'BYSCORE', 'LIMIT', taken[l], n, 'WITHSCORES')
    end
    if P.rem == 0 then
      for l = first, nl - 1 do take(l, remaining) end
    elseif P.rem == 2 and remaining > 0 then
      -- lateness: the next `remaining` due rows of each lane with their intervals, then one
      -- pick at a time of the lane whose head has the highest weight * (now - due) / interval
      -- (compared as products, an interval of 0 as 1 s, ties to the lower lane), exactly as
      -- engine.policy.reference_pass; the grants come back in the order they were picked.
      local heads = {}
      for l = first, nl - 1 do
        local got = ahead(l)
        if #got > 0 then
          local ms, dues_l = {}, {}
          for i = 1, #got, 2 do
            ms[#ms + 1] = got[i]
            dues_l[#dues_l + 1] = tonumber(got[i + 1]) - l * STRIDE
          end
          local recs = get_many(K, ms)
          local ivs = {}
          for i = 1, #recs do ivs[i] = math.max(1, (record(recs[i]))) end
          heads[l] = {dues = dues_l, ivs = ivs, at = 1, w = P.weights[l] or ONE}
        end
      end
      local picks, want = {}, {}
      for _ = 1, remaining do
        local best, best_w, best_late, best_iv
        for l = first, nl - 1 do
          local h = heads[l]
          if h and h.at <= #h.dues then
            local late = math.max(0, now - h.dues[h.at])
            local iv = h.ivs[h.at]
            if not best or product_gt(h.w, late, best_iv, best_w, best_late, iv) then
              best, best_w, best_late, best_iv = l, h.w, late, iv
            end
          end
        end
        if not best then break end
        heads[best].at = heads[best].at + 1
        picks[#picks + 1] = best
        want[best] = (want[best] or 0) + 1
      end
      local start = #members
      local at = {}
      for l = first, nl - 1 do
        if want[l] then
          at[l] = #members + 1
          take(l, want[l])
        end
      end
      local cols = {lanes, members, keys}
      local moved = {}
      for k, l in ipairs(picks) do
        for c, col in ipairs(cols) do
          moved[c] = moved[c] or {}
          moved[c][k] = col[at[l]]
        end
        at[l] = at[l] + 1
      end
      for c, col in ipairs(cols) do
        for k = 1, #picks do col[start + k] = moved[c][k] end
      end
    elseif remaining > 0 then
      local heads = {}
      for l = first, nl - 1 do
        local got = ahead(l)
        for i = 2, #got, 2 do heads[#heads + 1] = {tonumber(got[i]) - l * STRIDE, l} end
      end
      table.sort(heads, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
      local want = {}
      for i = 1, math.min(remaining, #heads) do
        local l = heads[i][2]
        want[l] = (want[l] or 0) + 1
      end
      local start = #members
      for l = first, nl - 1 do
        if want[l] then take(l, want[l]) end
      end
      in_due_order({lanes, members, keys}, keys, lanes, start)
    end
    for cls = 1, 3 do
      if P.shares[cls] > 0 then
        local extra = 0
        for _, l in ipairs(lanes_of[cls]) do extra = extra + grants[l] - before[l] end
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

  local n = #members
  local first = 0
  if n > 0 then
    chunked('ZREM', K[1], members)
    first = next_tokens(P, n, clock)
    meta[#meta + 1] = 'token'
    meta[#meta + 1] = fmt(P.token)
    local exp = fmt(clamp(now + lease_ms))
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
    -- the granted lanes' counters: read with one HMGET, written with the credits' HSET below
    -- (measured: cheaper than an HINCRBY per lane, and than reading them with the meta)
    local fields = {}
    for l = 0, nl - 1 do
      if grants[l] > 0 then fields[#fields + 1] = l end
    end
    local names = {}
    for i, l in ipairs(fields) do names[i] = 'g' .. l end
    local was = rcall('HMGET', K[4], unpack(names))
    for i, l in ipairs(fields) do
      meta[#meta + 1] = names[i]
      meta[#meta + 1] = fmt((tonumber(was[i]) or 0) + grants[l])
    end
  end
  if #meta > 0 then rcall('HSET', K[4], unpack(meta)) end
  return first, members, keys
end

-- ---------------------------------------------------------------- leased writes -----

-- Complete rows[i] with tokens[i] (next due: nexts[i] >= 0, else now + interval). Every row id
-- is checked before anything changes; a stale token reports 0 and changes nothing. A record is
-- written only when the complete clears its failures or its urgency.
local function complete_many(K, P, now, rows, tokens, nexts)
  check_members(P, rows)
  local live = live_leases(K, rows, tokens)
  local which = cleared(S_WHICH)
  for i = 1, #rows do
    if live[i] then which[#which + 1] = rows[i] end
  end
  local recs = get_many(K, which)
  local ok, ended, helds, back = cleared(S_OK), cleared(S_ENDED), cleared(S_HELDS), cleared(S_BACK)
  local high = P.lanes_high
  local k = 0
  local texts = {} -- key -> its decimal string: a batch's rows share few keys (one `now`)
  for i = 1, #rows do
    local row = rows[i]
    if live[i] then
      k = k + 1
      local interval, failures, was = record(recs[k])
      local discovered = has(was, F_DISCOVERED)
      local flags = F_LIVE + (discovered and F_DISCOVERED or 0)
      if failures ~= 0 or was ~= flags then
        put(K, tonumber(row), {interval = interval, failures = 0, flags = flags})
      end
      local lane = lane_for(P, discovered, interval, 0, false)
      local due = (nexts and nexts[i] >= 0) and nexts[i] or clamp(now + interval * 1000)
      if lane > high then high = lane end
      ended[#ended + 1] = row
      helds[#helds + 1] = live[i]
      local key = key_of(lane, due)
      local text = texts[key]
      if not text then
        text = fmt(key)
        texts[key] = text
      end
      back[#back + 1] = text
      back[#back + 1] = row
      ok[i] = 1
    else
      ok[i] = 0
    end
  end
  leases_end(K, ended, helds, back)
  note_lane(K, P, high)
  return ok
end

-- Give rows[i] back with the key their holder entry keeps: no record is read or written. A
-- lapsed lease already put back into ready keeps its ready score (its holder entry's key is
-- void: a prioritize may have moved the row since).
local function release_many(K, P, now, rows, tokens)
  check_members(P, rows)
  local live = live_leases(K, rows, tokens)
  local which = {}
  for i = 1, #rows do
    if live[i] then which[#which + 1] = rows[i] end
  end
  local waiting = #which > 0 and per_row('ZMSCORE', K[1], which) or {}
  local ok, ended, helds, back = {}, {}, {}, {}
  local k = 0
  for i = 1, #rows do
    if live[i] then
      k = k + 1
      ended[#ended + 1] = rows[i]
      helds[#helds + 1] = live[i]
      if not waiting[k] then
        back[#back + 1] = string.match(live[i], '^%d+:%d+:%d+:%d+:(%d+):')
        back[#back + 1] = rows[i]
      end
      ok[i] = 1
    else
      ok[i] = 0
    end
  end
  leases_end(K, ended, helds, back)
  return ok
end

-- Rows and tokens of a batch call from ARGV[at] and ARGV[at + 1]: the rows' members (MEMBER,
-- 8 digits each) joined, and the tokens, each followed by ':' (the way a holder entry starts
-- with it), joined. Two arguments, not 2n: the client formats and the server splits one string
-- each, which costs both sides less than 2n arguments (docs/redis.md, "The claim FCALL").
-- Returns rows, tokens (strings, see live_leases) and the index of the next argument.
local function rows_tokens(argv, at)
  local blob, toks = argv[at], argv[at + 1]
  local n = #blob / 8
  if n ~= math.floor(n) or not string.find(blob, '^%d*$') then
    fail('VALUE', 'rows must be 8-digit members')
  end
  local rows, tokens = cleared(S_ROWS), cleared(S_TOKENS)
  for i = 1, n do rows[i] = string.sub(blob, i * 8 - 7, i * 8) end
  for t in string.gmatch(toks, '%d+:') do tokens[#tokens + 1] = t end
  if #tokens ~= n then fail('VALUE', n .. ' rows but ' .. #tokens .. ' tokens') end
  return rows, tokens, at + 2
end

-- ---------------------------------------------------------------- registered functions -----

local function f_version(K, A)
  return {VERSION, LAYOUT}
end

-- ARGV: version, policy fields (on, bands, cold, urgent, s1, s2, s3, remainder, weights),
-- policy json, capacity, created_ms. Returns 1 if created, 0 if the queue already existed.
local function f_create(K, A)
  check_version(A)
  if rcall('EXISTS', K[4]) == 1 then return 0 end
  rcall('HSET', K[4], 'layout', LAYOUT, 'next_row', 0, 'token', 0, 'lanes_high', -1,
    'p_on', A[2], 'p_bands', A[3], 'p_cold', A[4], 'p_urgent', A[5], 'p_s1', A[6],
    'p_s2', A[7], 'p_s3', A[8], 'p_edf', A[9], 'p_w', A[10], 'policy', A[11], 'capacity', A[12],
    'created_ms', A[13], 'c0', 0, 'c1', 0, 'c2', 0, 'c3', 0)
  return 1
end

local function f_set_policy(K, A)
  check_version(A)
  queue_meta(K)
  rcall('HSET', K[4], 'p_on', A[2], 'p_bands', A[3], 'p_cold', A[4], 'p_urgent', A[5],
    'p_s1', A[6], 'p_s2', A[7], 'p_s3', A[8], 'p_edf', A[9], 'p_w', A[10], 'policy', A[11])
  return 1
end

-- ARGV: version, blob of n rows packed '<I6I4BB' (due, interval, provenance, failures).
-- Returns the first row id; the rows take consecutive ids.
local function f_add(K, A)
  check_version(A)
  local P = queue_meta(K)
  local blob = A[2]
  local n = #blob / 12
  local cap = tonumber(rcall('HGET', K[4], 'capacity'))
  if P.next_row + n > cap then
    fail('CAPACITY', 'queue holds ' .. P.next_row .. ' rows of ' .. cap)
  end
  local first = P.next_row
  local recs, z = {}, {}
  local high = P.lanes_high
  for i = 0, n - 1 do
    local due, interval, prov, failures = struct.unpack('<I6I4BB', blob, i * 12 + 1)
    local lane = lane_for(P, prov == 1, interval, failures, false)
    if lane > high then high = lane end
    recs[#recs + 1] = struct.pack(REC, interval, failures,
      F_LIVE + (prov == 1 and F_DISCOVERED or 0))
    z[#z + 1] = fmt(lane * STRIDE + due)
    z[#z + 1] = mem(first + i)
  end
  rcall('SETRANGE', K[3], fmt(first * RECLEN), table.concat(recs))
  rcall('HSET', K[4], 'next_row', fmt(first + n))
  note_lane(K, P, high)
  chunked('ZADD', K[1], z)
  return first
end

--[[ A batch goes back as one string: its first token (the i-th row's token is first + i - 1),
the rows' keys as the ZRANGEs returned them, and the rows' members joined, space separated
('' for none). Nothing in it is a number parsed or formatted here: the key texts and members
are the seeks' own strings, where converting them to numbers (a 16-digit key takes strtod's
multi-precision path) and back cost more than the seeks (engine.py RedisClaims reads it with
numpy). ]]
local function batch_reply(first, members, keys)
  if #members == 0 then return '' end
  return fmt(first) .. ' ' .. table.concat(keys, ' ') .. ' ' .. table.concat(members)
end

-- ARGV: version, now, budget, lease_ms, window, owner. Returns the batch (batch_reply).
local function f_claim(K, A)
  check_version(A)
  local P = queue_meta(K)
  local now, clock = times(A[2])
  expire(K, now)
  return batch_reply(claim_pass(K, P, now, clock, tonumber(A[3]), tonumber(A[4]),
    tonumber(A[5]), A[6]))
end

-- ARGV: version, now, rows, tokens (rows_tokens), has_next, nexts[n] (if has_next).
local function f_complete(K, A)
  check_version(A)
  local P = queue_meta(K)
  local now = now_of(A[2])
  local rows, tokens, at = rows_tokens(A, 3)
  local nexts = nil
  if A[at] == '1' then
    nexts = {}
    for i = 1, #rows do nexts[i] = tonumber(A[at + i]) end
  end
  return complete_many(K, P, now, rows, tokens, nexts)
end

-- ARGV: version, now, budget, lease_ms, window, owner, rows, tokens (rows_tokens).
-- One worker cycle in one round trip: complete the batch, then one claim pass. Returns the
-- new batch (batch_reply) and one byte per completed row (1: its token was live).
local function f_complete_claim(K, A)
  check_version(A)
  local P = queue_meta(K)
  local now, clock = times(A[2])
  local rows, tokens = rows_tokens(A, 7)
  local ok = complete_many(K, P, now, rows, tokens, nil)
  expire(K, now)
  local first, members, keys = claim_pass(K, P, now, clock, tonumber(A[3]), tonumber(A[4]),
    tonumber(A[5]), A[6])
  local bytes = cleared(S_BYTES)
  for i = 1, #ok do bytes[i] = ok[i] == 1 and '\1' or '\0' end
  return {batch_reply(first, members, keys), table.concat(bytes)}
end

-- ARGV: version, now, rows, tokens (rows_tokens).
local function f_release(K, A)
  check_version(A)
  local P = queue_meta(K)
  local rows, tokens = rows_tokens(A, 3)
  return release_many(K, P, now_of(A[2]), rows, tokens)
end

-- ARGV: version, now, row, token, retry_at (-1: back-off), permanent (0/1).
local function f_fail(K, A)
  check_version(A)
  local P = queue_meta(K)
  local now, row, token = now_of(A[2]), tonumber(A[3]), tonumber(A[4])
  local retry_at = tonumber(A[5])
  check_row(K, P, row)
  local m = mem(row)
  local h = leased(K, m, token)
  if not h then fail('LEASE', 'fail row ' .. row .. ': the token is stale') end
  local r = get(K, row)
  local f = r.failures + 1
  if A[6] == '1' and f < P.cold_after then f = P.cold_after end -- a 404 will not heal
  if f > 255 then f = 255 end
  -- Back-off: 30 s doubling per failure, never longer than the row's own interval.
  local backoff = 30000 * 2 ^ math.min(f - 1, 20)
  if backoff > r.interval * 1000 then backoff = r.interval * 1000 end
  local discovered = has(r.flags, F_DISCOVERED)
  r.failures = f
  r.flags = F_LIVE + (discovered and F_DISCOVERED or 0)
  leases_end(K, {m}, {h.value}, {}) -- a lapsed lease put back into ready: ZADD below moves it
  reschedule(K, P, row, r, lane_for(P, discovered, r.interval, f, false),
    retry_at >= 0 and retry_at or clamp(now + backoff), nil)
  return 1
end

-- ARGV: version, now, row, token, lease_ms, owner. Returns the new token (the old one is
-- stale). A lapsed lease put back into ready is taken out of it again, held by `owner`.
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

-- ARGV: version, now, row, rush (0/1).
local function f_prioritize(K, A)
  check_version(A)
  local P = queue_meta(K)
  local now, row, rush = now_of(A[2]), tonumber(A[3]), A[4] == '1'
  check_row(K, P, row)
  local r = get(K, row)
  if not has(r.flags, F_LIVE) then fail('VALUE', 'row ' .. row .. ' was removed') end
  local discovered = has(r.flags, F_DISCOVERED)
  r.flags = F_LIVE + (discovered and F_DISCOVERED or 0) + (rush and F_URGENT or 0)
  local _, h = where(K, mem(row)) -- in flight: its key waits in the holder entry
  reschedule(K, P, row, r, lane_for(P, discovered, r.interval, r.failures, rush), now, h)
  return 1
end

-- ARGV: version, row, provenance (0 submitted, 1 discovered). The lane is derived again from
-- the new provenance; due time, failures and urgency stay; a row in flight keeps its lease (its
-- key waits in the holder entry). Returns 1, or 0 when the row had that provenance already.
local function f_reclassify(K, A)
  check_version(A)
  local P = queue_meta(K)
  local row, discovered = tonumber(A[2]), A[3] == '1'
  check_row(K, P, row)
  local r = get(K, row)
  if not has(r.flags, F_LIVE) then fail('VALUE', 'row ' .. row .. ' was removed') end
  if has(r.flags, F_DISCOVERED) == discovered then return 0 end
  r.flags = r.flags + (discovered and F_DISCOVERED or -F_DISCOVERED)
  local key, h = where(K, mem(row))
  local _, due = split(key)
  local lane = lane_for(P, discovered, r.interval, r.failures, has(r.flags, F_URGENT))
  reschedule(K, P, row, r, lane, due, h)
  return 1
end

-- ARGV: version, row.
local function f_remove(K, A)
  check_version(A)
  local P = queue_meta(K)
  local row = tonumber(A[2])
  check_row(K, P, row)
  local r = get(K, row)
  if not has(r.flags, F_LIVE) then fail('VALUE', 'row ' .. row .. ' was removed') end
  r.flags = r.flags - F_LIVE
  if has(r.flags, F_URGENT) then r.flags = r.flags - F_URGENT end
  put(K, row, r) -- and the lease ends below: its holder's token is stale from now on
  local m = mem(row)
  rcall('ZREM', K[1], m)
  local v = rcall('HGET', K[5], m)
  if v then leases_end(K, {m}, {v}, {}) end
  return 1
end

-- ARGV: version, limit. Re-encode up to `limit` rows written with lanes disabled (lane 0, not
-- urgent) into their derived lanes, due times untouched. Refused while lanes are enabled.
local function f_restamp(K, A)
  check_version(A)
  local P = queue_meta(K)
  if P.on then fail('NOTALLOWED', 'restamp is refused while lanes are enabled') end
  local limit = tonumber(A[2])
  local on = {}
  for k, v in pairs(P) do on[k] = v end
  on.on = true
  local done, skip, left = 0, 0, false
  while true do
    local batch = rcall('ZRANGE', K[1], 0, fmt(HORIZON), 'BYSCORE', 'LIMIT', skip, 256,
      'WITHSCORES')
    if #batch == 0 then break end
    for i = 1, #batch, 2 do
      local row = tonumber(batch[i])
      local r = get(K, row)
      local lane = lane_for(on, has(r.flags, F_DISCOVERED), r.interval, r.failures,
        has(r.flags, F_URGENT))
      if lane == 0 then
        skip = skip + 1
      elseif done == limit then
        left = true
        break
      else
        reschedule(K, P, row, r, lane, tonumber(batch[i + 1]), nil) -- lane 0: key = due
        done = done + 1
      end
    end
    if left then break end
  end
  if not left then -- rows in flight keep their key in their holder entry
    local ms, holds = batch_rows(K, rcall('ZRANGE', K[2], 0, -1))
    for i, m in ipairs(ms) do
      local row = tonumber(m)
      local r = get(K, row)
      local h = holds[i]
      local lane = lane_for(on, has(r.flags, F_DISCOVERED), r.interval, r.failures,
        has(r.flags, F_URGENT))
      local was, due = split(h.key)
      if was == 0 and lane ~= 0 then
        if done == limit then
          left = true
          break
        end
        reschedule(K, P, row, r, lane, due, h)
        done = done + 1
      end
    end
  end
  return {done, left and 0 or 1}
end

-- ARGV: version, now, lanes. Per lane: ready rows, ready rows due, the due time of the first
-- ready row (-1: none); then, per row in flight: row, lane, due, expiry, owner.
local function f_stats(K, A)
  check_version(A)
  queue_meta(K)
  local now, nl = now_of(A[2]), tonumber(A[3])
  local per = {}
  for l = 0, nl - 1 do
    local lo, top = fmt(l * STRIDE), '(' .. fmt((l + 1) * STRIDE)
    local first = rcall('ZRANGE', K[1], lo, top, 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
    per[#per + 1] = rcall('ZCOUNT', K[1], lo, top)
    per[#per + 1] = rcall('ZCOUNT', K[1], lo, fmt(l * STRIDE + now))
    per[#per + 1] = #first > 0 and tonumber(first[2]) - l * STRIDE or -1
  end
  local flight = {}
  local ms, holds = batch_rows(K, rcall('ZRANGE', K[2], 0, -1))
  for i, m in ipairs(ms) do
    local h = holds[i]
    local lane, due = split(h.key)
    flight[#flight + 1] = tonumber(m)
    flight[#flight + 1] = lane
    flight[#flight + 1] = due
    flight[#flight + 1] = h.expiry
    flight[#flight + 1] = h.owner
  end
  return {now, per, flight}
end

local function register(name, fn, ro)
  local function entry(K, A)
    if not rcall then bind() end
    return fn(K, A)
  end
  redis.register_function{function_name = name, callback = entry,
    flags = ro and {'no-writes'} or {}}
end

register('lanes_version', f_version, true)
register('lanes_create', f_create)
register('lanes_set_policy', f_set_policy)
register('lanes_add', f_add)
register('lanes_claim', f_claim)
register('lanes_complete', f_complete)
register('lanes_complete_claim', f_complete_claim)
register('lanes_release', f_release)
register('lanes_fail', f_fail)
register('lanes_renew', f_renew)
register('lanes_prioritize', f_prioritize)
register('lanes_remove', f_remove)
register('lanes_reclassify', f_reclassify)
register('lanes_restamp', f_restamp)
register('lanes_stats', f_stats, true)

-- ---------------------------------------------------------------- pools on several hosts -----
--[[ A render pool whose workers run on many hosts keeps every row's URL in Redis, so any host's
worker renders any row. Two more keys of the queue (same hash tag), passed as KEYS[6..7]:

  urls      HASH  row id -> URL
  url_rows  HASH  URL -> row id

A URL and its row are added in one FCALL (lanes_add_urls), so a worker never claims a row whose
URL it cannot find, and URLs are never removed or changed (a reader scanning them sees every
URL that existed when it began). ]]

-- KEYS: the five queue keys, urls, url_rows. ARGV: version, now ('' = server time), a blob of n
-- rows as lanes_add takes them, then the n URLs. A URL already known (or given twice) is left
-- alone, except that a parked row (due = HORIZON, see --max-failures) is made due now in its own
-- lane, as lanes_prioritize 'wait' does. Returns {rows[n], states[n]}: per URL its row id and 1
-- (added), 0 (known) or 2 (known, unparked). Capacity is checked before anything changes.
local function f_add_urls(K, A)
  check_version(A)
  local P = queue_meta(K)
  local blob = A[3]
  local n = #blob / 12
  if n ~= math.floor(n) or #A ~= 3 + n then
    fail('VALUE', 'add_urls needs 12 bytes of row and one URL per row')
  end
  local rows, states, parts, fresh = {}, {}, {}, {}
  local seen = {}
  for i = 1, n do
    local url = A[3 + i]
    local row = seen[url] or rcall('HGET', K[7], url)
    if row then
      rows[i], states[i] = tonumber(row), 0
    else
      local new = P.next_row + #parts
      parts[#parts + 1] = string.sub(blob, (i - 1) * 12 + 1, i * 12)
      fresh[#fresh + 1] = fmt(new)
      fresh[#fresh + 1] = url
      seen[url] = new
      rows[i], states[i] = new, 1
    end
  end
  local cap = tonumber(rcall('HGET', K[4], 'capacity'))
  if P.next_row + #parts > cap then
    fail('CAPACITY', 'queue holds ' .. P.next_row .. ' rows of ' .. cap .. ', '
      .. #parts .. ' new URLs')
  end
  for i = 1, n do
    if states[i] == 0 and rows[i] < P.next_row then -- not one this call adds
      local key = where(K, mem(rows[i]))
      if key and select(2, split(key)) == HORIZON then
        f_prioritize(K, {A[1], A[2], fmt(rows[i]), '0'})
        states[i] = 2
      end
    end
  end
  if #parts > 0 then
    f_add(K, {A[1], table.concat(parts)})
    chunked('HSET', K[6], fresh)
    local back = {}
    for j = 1, #fresh, 2 do
      back[#back + 1] = fresh[j + 1]
      back[#back + 1] = fresh[j]
    end
    chunked('HSET', K[7], back)
  end
  return {rows, states}
end

-- ARGV: version, then owner ids whose process is gone (RedisEngine.reap checks that). Their
-- leases end now: each row in flight goes back to ready with the key its holder entry keeps,
-- as a release would put it, so it is claimable at once; a lapsed lease already back in ready
-- only loses its holder entry. Returns how many rows came back.
local function f_reap(K, A)
  check_version(A)
  queue_meta(K)
  local dead = {}
  for i = 2, #A do dead[A[i]] = true end
  local held = rcall('HGETALL', K[5])
  local gone, helds, keys = {}, {}, {}
  for i = 1, #held, 2 do
    local h = string.byte(held[i]) ~= 98 and holding(held[i + 1]) -- 'b': a batch's record
    if h and dead[h.owner] then
      gone[#gone + 1] = held[i]
      helds[#helds + 1] = held[i + 1]
      keys[#keys + 1] = fmt(h.key)
    end
  end
  local waiting = #gone > 0 and per_row('ZMSCORE', K[1], gone) or {}
  local back = {}
  for i = 1, #gone do
    if not waiting[i] then -- in flight (a lapsed lease back in ready keeps its ready score)
      back[#back + 1] = keys[i]
      back[#back + 1] = gone[i]
    end
  end
  local n = #back / 2
  leases_end(K, gone, helds, back)
  return n
end

register('lanes_add_urls', f_add_urls)
register('lanes_reap', f_reap)
