-- tokenbucket.lua: the exact token bucket, the twin of ratelimit's (*State).Step and StepAll.
-- It decides one bucket, or several as one (all or nothing), in integers of at most 2^53.
--
-- KEYS[1..K]  the buckets, one per check (K = 1 for a single check)
-- ARGV[1]     now, in µs since the Unix epoch, or "" to read the server's TIME
-- then per key, in the order of KEYS:
--   cost      the tokens to take; or, negative, the tokens to ask for without taking any
--             (a peek asks for one: -1)
--   n         the number of limits, 1 to 8
--   n times:  capacity c, refill tokens r and refill period p in µs (the rate in lowest terms),
--             and the limit's signature: c, r and p as unsigned LEB128 varints, as stored
--
-- Stored value, a binary string (21 bytes for a typical policy):
--   last (7 bytes, big-endian) { level (7 bytes, big-endian) c r p (varints) } per limit
-- last is the time up to which the bucket is refilled (µs); a level counts in 1/p of a token
-- (level/p whole tokens plus a remainder). Only a check that takes tokens writes; the key
-- expires (PX) once the bucket would be full, rounded up to the millisecond, at least 1 ms.
--
-- Reply: per key, 7 integers: allowed (1 or 0: its own bucket holds the cost), remaining
-- tokens, retry after (µs), reset after (µs), index of the binding limit (from 0), converted
-- (1 when another policy wrote the bucket) and the clock's catch-up (µs: the bucket's last
-- minus now, when the clock is behind it). The caller adds the catch-up to each wait that is
-- not 0 (the sum can pass 2^53). With several keys every cost is taken when every key is
-- allowed, and none otherwise.
-- Errors: "ratelimit: invalid argument: <rule>" and "ratelimit: malformed bucket state: <what>".
--
-- Exactness: every value is an integer of at most 2^53, and so is every product formed. For
-- 0 <= a <= 2^53, math.ceil(a / b) is exact and math.floor(a / b) is at most one too large,
-- which the test "q * b > a" corrects.

local MAX = 9007199254740992     -- 2^53
local MAXTIME = 4503599627370496 -- 2^52
local INVALID = 'ratelimit: invalid argument: '
local CORRUPT = 'ratelimit: malformed bucket state: '
local floor, ceil, sub, byte = math.floor, math.ceil, string.sub, string.byte

local now = ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(now)
  if now == nil or now ~= now then
    return redis.error_reply(INVALID .. 'time must be a number')
  end
  if now < 0 or now > MAXTIME then
    return redis.error_reply(INVALID .. 'time must be between the Unix epoch and 2^52 µs after it')
  end
  if now ~= floor(now) then
    return redis.error_reply(INVALID .. 'time must be a whole number of microseconds')
  end
end

-- Per key j and limit i, at (j-1)*8+i: the request's c, r, p, signature and the level.
local C, R, P, S, L = {}, {}, {}, {}, {}
-- Per key: cost, number of limits, time decided at, catch-up, converted, allowed.
local COST, N, T0, BACK, CONV, OK = {}, {}, {}, {}, {}, {}
local all = true
local a = 2

for j = 1, #KEYS do
  -- The request, checked by Limit.Validate's rules in its order and words.
  local cost, n = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  if n == nil or n < 1 or n ~= floor(n) then
    return redis.error_reply(INVALID .. 'a policy needs at least one limit')
  end
  if n > 8 then
    return redis.error_reply(INVALID .. 'a policy may combine at most 8 limits')
  end
  local o = (j - 1) * 8
  for i = 1, n do
    local x = a + 4 * i - 2
    local c, r, p = tonumber(ARGV[x]), tonumber(ARGV[x + 1]), tonumber(ARGV[x + 2])
    local rule
    if c == nil or c ~= c then rule = 'capacity must be a number'
    elseif r == nil or r ~= r then rule = 'refill tokens must be a number'
    elseif p == nil or p ~= p then rule = 'refill period must be a number'
    elseif c < 1 then rule = 'capacity must be at least 1'
    elseif c ~= floor(c) then rule = 'capacity must be an integer'
    elseif r < 1 then rule = 'refill tokens must be at least 1'
    elseif r ~= floor(r) then rule = 'refill tokens must be an integer'
    elseif p < 1 then rule = 'refill period must be at least 1µs'
    elseif p ~= floor(p) then rule = 'refill period must be a whole number of microseconds'
    elseif c > MAX or c == MAX and ARGV[x] ~= '9007199254740992' then
      rule = 'capacity must be at most 2^53' -- (2^53 + 1 reads as 2^53)
    elseif r > MAX or r == MAX and ARGV[x + 1] ~= '9007199254740992' then
      rule = 'refill tokens must be at most 2^53'
    elseif p > MAX or p == MAX and ARGV[x + 2] ~= '9007199254740992' then
      rule = 'refill period in µs must be at most 2^53'
    elseif c > MAX / p then rule = 'capacity * refill period in lowest terms must be at most 2^53'
    elseif ARGV[x + 3] == nil then rule = 'a limit needs its signature'
    end
    if rule then
      if n > 1 then
        rule = 'limit ' .. (i - 1) .. ': ' .. rule
      end
      return redis.error_reply(INVALID .. rule)
    end
    C[o + i], R[o + i], P[o + i], S[o + i] = c, r, p, ARGV[x + 3]
  end
  if cost == nil or cost ~= cost then
    return redis.error_reply(INVALID .. 'cost must be a number')
  end
  if cost == 0 then
    return redis.error_reply(INVALID .. 'cost must be at least 1')
  end
  if cost ~= floor(cost) then
    return redis.error_reply(INVALID .. 'cost must be an integer')
  end
  local need = cost
  if need < 0 then
    need = -need
  end
  for i = 1, n do
    if need > C[o + i] then
      return redis.error_reply(INVALID .. 'cost must not exceed capacity')
    end
  end
  a = a + 2 + 4 * n

  -- The stored bucket: refilled by the time elapsed at the rate of the limits that wrote it.
  local ok, raw = pcall(redis.call, 'GET', KEYS[j])
  if not ok then
    return redis.error_reply(CORRUPT .. 'not a string')
  end
  local t0, back, conv, exists = now, 0, 0, false
  if raw then
    local len = #raw
    if len < 17 then
      return redis.error_reply(CORRUPT .. 'too short')
    end
    local last = struct.unpack('>I7', raw)
    if last > MAXTIME then
      return redis.error_reply(CORRUPT .. 'time out of range')
    end
    if last > now then
      t0, back = last, last - now
    end
    local el = t0 - last
    -- Written by this very policy: its bands are read in place.
    local pos, i = 8, 1
    while i <= n do
      local sig = S[o + i]
      if sub(raw, pos + 7, pos + 6 + #sig) ~= sig then
        break
      end
      pos, i = pos + 7 + #sig, i + 1
    end
    local full = true
    if i > n and pos == len + 1 then
      pos = 8
      for i = 1, n do
        local c, r, p = C[o + i], R[o + i], P[o + i]
        local lv = struct.unpack('>I7', raw, pos)
        local missing = c * p - lv
        if missing < 0 then
          return redis.error_reply(CORRUPT .. 'field out of range')
        end
        if missing > 0 and el < ceil(missing / r) then
          lv, full = lv + el * r, false
        else
          lv = c * p
        end
        L[o + i] = lv
        pos = pos + 7 + #S[o + i]
      end
    else
      -- Written by another policy: every band is decoded, refilled at its own rate, and
      -- carried over (see Step).
      local SL, SC, SR, SP = {}, {}, {}, {}
      local m = 0
      pos = 8
      while pos <= len do
        m = m + 1
        if m > 8 or pos + 9 > len then
          return redis.error_reply(CORRUPT .. 'wrong number of fields')
        end
        local lv = struct.unpack('>I7', raw, pos)
        pos = pos + 7
        local v = {}
        for f = 1, 3 do
          local x, mul, done = 0, 1, false
          for q = pos, pos + 7 do
            local b = byte(raw, q)
            if b == nil then
              break
            end
            x, mul = x + (b % 128) * mul, mul * 128
            if b < 128 then
              -- (a last byte of 0 after others is a varint longer than it needs)
              pos, done = q + 1, b > 0 or q == pos
              break
            end
          end
          if not done then
            return redis.error_reply(CORRUPT .. 'truncated limit')
          end
          v[f] = x
        end
        local c, r, p = v[1], v[2], v[3]
        if c < 1 or r < 1 or p < 1 or c > MAX or r > MAX or p > MAX or c > MAX / p or lv > c * p then
          return redis.error_reply(CORRUPT .. 'field out of range')
        end
        local missing = c * p - lv
        if missing > 0 and el < ceil(missing / r) then
          lv, full = lv + el * r, false
        else
          lv = c * p
        end
        SL[m], SC[m], SR[m], SP[m] = lv, c, r, p
      end
      if not full then
        exists, conv = true, 1
        local fewest = -1
        for k = 1, m do
          local q = floor(SL[k] / SP[k])
          if q * SP[k] > SL[k] then q = q - 1 end
          if fewest < 0 or q < fewest then fewest = q end
        end
        -- First each limit takes the band it wrote, then each limit left takes the next band
        -- left, its whole tokens up to the capacity and below it the part of a token too; a
        -- limit with no band left takes the bucket's fewest whole tokens.
        local used, match, matched = {}, {}, 0
        for i = 1, n do
          for k = 1, m do
            if not used[k] and SC[k] == C[o + i] and SR[k] == R[o + i] and SP[k] == P[o + i] then
              match[i], used[k], matched = k, true, matched + 1
              break
            end
          end
        end
        if matched == n and matched == m then
          conv = 0
        end
        local nextband = 1
        for i = 1, n do
          local c, p = C[o + i], P[o + i]
          local k = match[i]
          if k then
            L[o + i] = SL[k]
          else
            while nextband <= m and used[nextband] do
              nextband = nextband + 1
            end
            local tok, lv = fewest, nil
            if nextband <= m then
              local hp = SP[nextband]
              used[nextband] = true
              tok = floor(SL[nextband] / hp)
              if tok * hp > SL[nextband] then tok = tok - 1 end
              if tok < c then
                -- carry: the band's part of a token in units of 1/p, rounded down.
                local rem = SL[nextband] - tok * hp
                local cr
                local q = floor(hp / p)
                if q * p > hp then q = q - 1 end
                if q * p == hp then
                  cr = floor(rem / q)
                  if cr * q > rem then cr = cr - 1 end
                else
                  q = floor(p / hp)
                  if q * hp > p then q = q - 1 end
                  if q * hp == p then
                    cr = rem * q
                  else
                    cr = floor(rem / hp * p) - 2
                    if cr < 0 then cr = 0 end
                  end
                end
                lv = tok * p + cr
              end
            end
            if lv == nil then
              if tok > c then tok = c end
              lv = tok * p
            end
            L[o + i] = lv
          end
        end
      end
    end
    if full then
      -- Full by now: the same as a missing bucket, decided at now.
      t0, back, conv = now, 0, 0
    else
      exists = true
    end
  end
  if not exists then
    for i = 1, n do
      L[o + i] = C[o + i] * P[o + i]
    end
  end

  local allowed = true
  for i = 1, n do
    if L[o + i] < need * P[o + i] then
      allowed = false
      break
    end
  end
  COST[j], N[j], T0[j], BACK[j], CONV[j], OK[j] = cost, n, t0, back, conv, allowed
  all = all and allowed
end

-- Decide, take and write: every key's cost when all are allowed, none otherwise.
local reply = {}
for j = 1, #KEYS do
  local cost, n, o, back = COST[j], N[j], (j - 1) * 8, BACK[j]
  local take = all and cost > 0
  local remaining, bound, retry, reset = -1, 1, 0, 0
  local need = cost
  if need < 0 then
    need = -need
  end
  for i = 1, n do
    local p = P[o + i]
    local lv = L[o + i]
    if take then
      lv = lv - cost * p
      L[o + i] = lv
    end
    local tok = floor(lv / p)
    if tok * p > lv then tok = tok - 1 end
    if remaining < 0 or tok < remaining then
      remaining = tok
      if OK[j] then bound = i end
    end
    if not OK[j] and lv < need * p then
      local w = ceil((need * p - lv) / R[o + i])
      if w > retry then
        retry, bound = w, i
      end
    end
    local w = ceil((C[o + i] * p - lv) / R[o + i])
    if w > reset then
      reset = w
    end
  end
  if take then
    local parts = {struct.pack('>I7', T0[j])}
    for i = 1, n do
      parts[i + 1] = struct.pack('>I7', L[o + i]) .. S[o + i]
    end
    -- The key lives until the bucket is full: (reset + back) / 1 ms, rounded up once.
    local qr = floor(reset / 1000)
    if qr * 1000 > reset then qr = qr - 1 end
    local qb = floor(back / 1000)
    local ms = qr + qb + ceil((reset - qr * 1000 + back - qb * 1000) / 1000)
    if ms < 1 then
      ms = 1
    end
    redis.call('SET', KEYS[j], table.concat(parts), 'PX', ms)
  end
  local ok = 0
  if OK[j] then ok = 1 end
  local x = (j - 1) * 7
  reply[x + 1], reply[x + 2], reply[x + 3], reply[x + 4] = ok, remaining, retry, reset
  reply[x + 5], reply[x + 6], reply[x + 7] = bound - 1, CONV[j], back
end
return reply
