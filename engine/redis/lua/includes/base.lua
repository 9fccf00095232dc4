--[[ The base of every function of the library render_lanes: the data model, the constants, the
standard functions as upvalues and the small helpers everything uses.

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

A token is valid while the row's holder entry holds it, as in shared memory (docs/design.md §5: stale
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

local VERSION = '21' -- bump with any change to the payload (engine.py LIBRARY_VERSION)
local LAYOUT = '5' -- bump with any change to a key's or a record's meaning (engine.py too)
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

-- Scratch tables kept between calls (S_* beside their users, and records' GETS): one grown to
-- a batch's size stays that size, where a new table per call grows one doubling at a time (a
-- realloc and a rehash each; table growth was a fifth of a cycle's instructions). Only for
-- arrays that never leave the call that fills them; `cleared` empties one before use.
local function cleared(t)
  for i = #t, 1, -1 do t[i] = nil end
  return t
end

-- Variadic commands in chunks: cmd(key, prefix..., items[i..j]...).
local function chunked(cmd, key, items)
  for i = 1, #items, CHUNK do
    local j = math.min(i + CHUNK - 1, #items)
    rcall(cmd, key, unpack(items, i, j))
  end
end

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

