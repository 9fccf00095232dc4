-- Exact comparison of products of three integers, for the lateness remainder.
--- @include "base"

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
  if a1 == b1 and a2 == b2 and a3 == b3 then return false end -- a tie, common: no limbs
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
