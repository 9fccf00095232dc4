--[[ lanes_add_urls: add rows with their URLs, for a render pool whose workers run
on many hosts: every row's URL is in Redis, so any host's worker renders any row. A URL and its
row are added in one FCALL, so a worker never claims a row whose URL it cannot find, and URLs
are never removed or changed (a reader scanning them sees every URL that existed when it
began).
KEYS: the five queue keys (includes/base.lua), then urls (HASH row id -> URL), url_rows
  (HASH URL -> row id) and url_index (ZSET of URL .. '\n' .. MEMBER, the URLs in byte order:
  lanes_prioritize_prefix), with the queue's hash tag.
ARGV: version, now ('' = server time), a blob of n rows as lanes_add takes them, then the n
  URLs.
A URL already known (or given twice) is left alone, except that a parked row (due = HORIZON,
see --max-failures) is made due now in its own lane, as lanes_prioritize 'wait' does.
Capacity is checked before anything changes.
Returns {rows[n], states[n]}: per URL its row id and 1 (added), 0 (known) or 2 (known,
unparked). ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "holder"
--- @include "add_rows"
--- @include "prioritize"
--- @include "register"

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
        prioritize_row(K, P, now_of(A[2]), rows[i], false)
        states[i] = 2
      end
    end
  end
  if #parts > 0 then
    add_rows(K, P, table.concat(parts))
    chunked('HSET', K[6], fresh)
    local back, index = {}, {}
    for j = 1, #fresh, 2 do
      back[#back + 1] = fresh[j + 1]
      back[#back + 1] = fresh[j]
      index[#index + 1] = '0'
      index[#index + 1] = fresh[j + 1] .. '\n' .. mem(tonumber(fresh[j]))
    end
    chunked('HSET', K[7], back)
    chunked('ZADD', K[8], index)
  end
  return {rows, states}
end

register('lanes_add_urls', f_add_urls)
