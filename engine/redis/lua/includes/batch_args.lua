-- A batch call's rows and tokens as they come in, and a granted batch as it goes back.
--- @include "base"

local S_ROWS, S_TOKENS = {}, {} -- rows_tokens


-- The members (MEMBER, 8 digits each) joined in `blob`, into `into` (emptied first).
local function members_of(blob, into)
  local n = #blob / 8
  if n ~= math.floor(n) or not string.find(blob, '^%d*$') then
    fail('VALUE', 'rows must be 8-digit members')
  end
  local rows = cleared(into)
  for i = 1, n do rows[i] = string.sub(blob, i * 8 - 7, i * 8) end
  return rows
end

-- Rows and tokens of a batch call from ARGV[at] and ARGV[at + 1]: the rows' members (MEMBER,
-- 8 digits each) joined, and the tokens, each followed by ':' (the way a holder entry starts
-- with it), joined. Two arguments, not 2n: the client formats and the server splits one string
-- each, which costs both sides less than 2n arguments (docs/redis.md, "The claim FCALL").
-- Returns rows, tokens (strings, see live_leases) and the index of the next argument.
local function rows_tokens(argv, at)
  local blob, toks = argv[at], argv[at + 1]
  local rows, tokens = members_of(blob, S_ROWS), cleared(S_TOKENS)
  local n = #rows
  for t in string.gmatch(toks, '%d+:') do tokens[#tokens + 1] = t end
  if #tokens ~= n then fail('VALUE', n .. ' rows but ' .. #tokens .. ' tokens') end
  return rows, tokens, at + 2
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
