--[[ lanes_prioritize_prefix: a page of the rows whose URL starts with a prefix made due now,
urgent (rush) or in their own lanes, as lanes_prioritize_many makes them (a removed row
skipped): a scope of POST /api/prioritize, matched and prioritized here, so no URL crosses the
wire (docs/serve.md).
KEYS: the five queue keys (includes/base.lua), then urls (HASH row id -> URL) and url_index
  (ZSET, every score 0, member = URL .. '\n' .. the row's MEMBER: the URLs in byte order, so
  the URLs under a prefix are one ZRANGE BYLEX), with the queue's hash tag.
ARGV: version, now ('' = server time), rush (0/1), prefix, after (the last member of the
  previous page, '' for the first), limit (members per page).
The page's rows are checked before any changes. Returns {matched, done, last}: the members of
the page, the rows made due and the page's last member ('' when it was the last page); or {-1}
with nothing changed when the index lacks URLs of the table (a queue made before it:
RedisUrls.index fills it in). ]]
--- @include "base"
--- @include "tokens"
--- @include "queue"
--- @include "prioritize"
--- @include "register"

local S_PAGE = {} -- f_prioritize_prefix

local function f_prioritize_prefix(K, A)
  check_version(A)
  if rcall('ZCARD', K[7]) ~= rcall('HLEN', K[6]) then return {-1} end
  local P, now, rush = queue_meta(K), now_of(A[2]), A[3] == '1'
  local prefix, after, limit = A[4], A[5], tonumber(A[6])
  if not limit or limit < 1 or limit ~= math.floor(limit) then
    fail('VALUE', 'limit must be a whole number above 0')
  end
  -- No URL holds \255 (UTF-8 never does), so every member under the prefix sorts below this.
  local page = rcall('ZRANGE', K[7], after == '' and '[' .. prefix or '(' .. after,
    '(' .. prefix .. '\255', 'BYLEX', 'LIMIT', 0, limit)
  local rows = cleared(S_PAGE)
  for i = 1, #page do rows[i] = string.sub(page[i], -8) end
  local done = prioritize_rows(K, P, now, rows, rush)
  return {#page, done, #page == limit and page[#page] or ''}
end

register('lanes_prioritize_prefix', f_prioritize_prefix)
