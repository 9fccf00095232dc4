-- The leases of owners judged gone (a dead process on its host, or a heartbeat that lapsed)
-- ended, their rows put back: what lanes_reap and lanes_heartbeat share.
--- @include "base"
--- @include "holder"
--- @include "leases"

-- End every lease `dead` (owner id -> true) holds. Each row in flight goes back to ready with
-- the key its holder entry keeps, as a release would put it, so it is claimable at once; a
-- lapsed lease already back in ready only loses its holder entry. Either way the owner's tokens
-- are stale from here on: a late complete of theirs is refused (LeaseLost). Reads the holder
-- hash whole: rows in flight, a pool's workers times their batch, not the queue. Returns how
-- many rows came back.
local function reap_owners(K, dead)
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
  leases_end(K, gone, helds, back)
  return #back / 2
end
