-- The server clock and fencing tokens: a call's `now`, and the tokens a grant reserves.
--- @include "base"

local S_TEXTS = {} -- token_texts

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
