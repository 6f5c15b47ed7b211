-- tokenbucket.lua: the exact token bucket, the twin of ratelimit's (*State).Step and StepAll.
-- It decides one bucket, or several as one (all or nothing), in integers of at most 2^53.
--
-- KEYS[1..K]  the buckets, one per check (K = 1 for a single check)
-- ARGV[1]     now, in µs since the Unix epoch, or "" to read the server's TIME; left out (two
--             values per key and no more), the server's TIME
-- then two per key, in the order of KEYS:
--   cost      the tokens to take; or, negative, the tokens to ask for without taking any
--             (a peek asks for one: -1)
--   policy    a binary string: the number of limits n (1 byte, 1 to 8), then per limit the
--             length of its signature (1 byte) and the signature: its capacity c, refill tokens r
--             and refill period p in µs, the rate in lowest terms, as unsigned LEB128 varints,
--             as the bucket stores them (a string with no zero byte). Args builds it once per
--             policy. The varints are read in floating point: 2^53 + 1 reads as 2^53.
--
-- Stored value, a binary string (19 bytes for a typical policy):
--   last (7 bytes, big-endian) { level (7 bytes, big-endian) c r p (varints) } per limit
-- last is the time up to which the bucket is refilled (µs); a level counts in 1/p of a token
-- (level/p whole tokens plus a remainder). Only a check that takes tokens writes; the key
-- expires (PX) once the bucket would be full, rounded up to the millisecond, at least 1 ms.
--
-- Reply: per key, 5 integers: flags (1: its own bucket holds the cost; 2: another policy
-- wrote the bucket; 4 times the index of the binding limit, from 0), remaining tokens, reset
-- after (µs), retry after (µs), and the clock's catch-up (µs: the bucket's last minus now, when
-- the clock is behind it). For one key whose retry and catch-up are 0 (most checks), only the
-- first 3. The caller adds the catch-up to each wait that is not 0 (the sum can pass 2^53). With
-- several keys every cost is taken when every key is allowed, and none otherwise.
-- Errors: "ratelimit: invalid argument: <rule>" and "ratelimit: malformed bucket state: <what>".
--
-- Exactness: every value is an integer of at most 2^53, and so is every product formed. For
-- 0 <= a <= 2^53 and b >= 1, (a - a % b) / b is floor(a / b) or, only near 2^53, one more,
-- which the test "q * b > a" corrects; the same with "q * b < a" gives the ceiling. (a % b is
-- an operator of the VM, math.floor a function call.)

local MAX = 9007199254740992     -- 2^53
local MAXTIME = 4503599627370496 -- 2^52
local INVALID = 'ratelimit: invalid argument: '
local CORRUPT = 'ratelimit: malformed bucket state: '
local floor, sub, byte = math.floor, string.sub, string.byte

-- ARGV[1] is the time when ARGV has one more than two values per key.
local a, now = 1, ''
if #ARGV % 2 == 1 then
  a, now = 2, ARGV[1]
end
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
  if now % 1 ~= 0 then
    return redis.error_reply(INVALID .. 'time must be a whole number of microseconds')
  end
end

-- W holds, per key, its cost, n, the time it is decided at, the catch-up, converted (0 or 1)
-- and allowed (true or false), then per limit c, r, p, signature and level: 6 + 5n slots from
-- the key's base w (limit i at w + 2 + 5i). It is made with room for one key of one limit.
local W = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
local all = true
local w = 0

for j = 1, #KEYS do
  -- The request, checked by Limit.Validate's rules in its order and words.
  local cost, pol = tonumber(ARGV[a]), ARGV[a + 1]
  a = a + 2
  local n = pol and byte(pol, 1)
  if n == nil or n < 1 then
    return redis.error_reply(INVALID .. 'a policy needs at least one limit')
  end
  if n > 8 then
    return redis.error_reply(INVALID .. 'a policy may combine at most 8 limits')
  end
  local pos = 2
  for i = 1, n do
    local x = w + 2 + 5 * i
    local len = byte(pol, pos)
    local rule
    if len == nil or #pol < pos + len then
      rule = 'a limit needs its signature'
    else
      -- c, r and p from the signature's varints, its bytes read in one call
      local bs = {byte(pol, pos + 1, pos + len)}
      local q, stop = 1, len
      for f = 0, 2 do
        local v, mul, b = 0, 1, 128
        while b >= 128 and q <= stop do
          b = bs[q]
          v, mul, q = v + (b % 128) * mul, mul * 128, q + 1
        end
        W[x + f] = v
      end
      stop = pos + len
      q = q + pos
      local c, r, p = W[x], W[x + 1], W[x + 2]
      if q ~= stop + 1 then rule = 'a limit needs its signature'
      elseif c < 1 then rule = 'capacity must be at least 1'
      elseif r < 1 then rule = 'refill tokens must be at least 1'
      elseif p < 1 then rule = 'refill period must be at least 1µs'
      elseif c > MAX then rule = 'capacity must be at most 2^53'
      elseif r > MAX then rule = 'refill tokens must be at most 2^53'
      elseif p > MAX then rule = 'refill period in µs must be at most 2^53'
      elseif c > MAX / p then rule = 'capacity * refill period in lowest terms must be at most 2^53'
      end
      W[x + 3] = sub(pol, pos + 1, stop)
      pos = stop + 1
    end
    if rule then
      if n > 1 then
        rule = 'limit ' .. (i - 1) .. ': ' .. rule
      end
      return redis.error_reply(INVALID .. rule)
    end
  end
  if cost == nil or cost ~= cost then
    return redis.error_reply(INVALID .. 'cost must be a number')
  end
  if cost == 0 then
    return redis.error_reply(INVALID .. 'cost must be at least 1')
  end
  if cost % 1 ~= 0 then
    return redis.error_reply(INVALID .. 'cost must be an integer')
  end
  local need = cost
  if need < 0 then
    need = -need
  end
  for i = 1, n do
    if need > W[w + 2 + 5 * i] then
      return redis.error_reply(INVALID .. 'cost must not exceed capacity')
    end
  end

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
    local last, lv1 = struct.unpack('>I7I7', raw)
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
      local sig = W[w + 5 + 5 * i]
      if sub(raw, pos + 7, pos + 6 + #sig) ~= sig then
        break
      end
      pos, i = pos + 7 + #sig, i + 1
    end
    local full = true
    if i > n and pos == len + 1 then
      pos = 8
      for i = 1, n do
        local x = w + 2 + 5 * i
        local c, r, p = W[x], W[x + 1], W[x + 2]
        local lv = lv1
        if i > 1 then
          lv = struct.unpack('>I7', raw, pos)
        end
        local missing = c * p - lv
        if missing < 0 then
          return redis.error_reply(CORRUPT .. 'field out of range')
        end
        local q = (missing - missing % r) / r
        if q * r < missing then q = q + 1 end
        if missing > 0 and el < q then
          lv, full = lv + el * r, false
        else
          lv = c * p
        end
        W[x + 4] = lv
        pos = pos + 7 + #W[x + 3]
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
        local q = (missing - missing % r) / r
        if q * r < missing then q = q + 1 end
        if missing > 0 and el < q then
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
            local x = w + 2 + 5 * i
            if not used[k] and SC[k] == W[x] and SR[k] == W[x + 1] and SP[k] == W[x + 2] then
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
          local x = w + 2 + 5 * i
          local c, p = W[x], W[x + 2]
          local k = match[i]
          if k then
            W[x + 4] = SL[k]
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
            W[x + 4] = lv
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
      local x = w + 2 + 5 * i
      W[x + 4] = W[x] * W[x + 2]
    end
  end

  local allowed = true
  for i = 1, n do
    local x = w + 2 + 5 * i
    if W[x + 4] < need * W[x + 2] then
      allowed = false
      break
    end
  end
  W[w + 1], W[w + 2], W[w + 3], W[w + 4], W[w + 5], W[w + 6] = cost, n, t0, back, conv, allowed
  w = w + 6 + 5 * n
  all = all and allowed
end

-- Decide, take and write: every key's cost when all are allowed, none otherwise.
local reply
w = 0
for j = 1, #KEYS do
  local cost, n, t0, back, conv, ok = W[w + 1], W[w + 2], W[w + 3], W[w + 4], W[w + 5], W[w + 6]
  local take = all and cost > 0
  local remaining, bound, retry, reset = -1, 1, 0, 0
  local need = cost
  if need < 0 then
    need = -need
  end
  local value
  if take then
    value = struct.pack('>I7', t0)
  end
  for i = 1, n do
    local x = w + 2 + 5 * i
    local r, p, lv = W[x + 1], W[x + 2], W[x + 4]
    if take then
      lv = lv - cost * p
      value = value .. struct.pack('>I7', lv) .. W[x + 3]
    end
    local tok = (lv - lv % p) / p
    if tok * p > lv then tok = tok - 1 end
    if remaining < 0 or tok < remaining then
      remaining = tok
      if ok then bound = i end
    end
    if not ok and lv < need * p then
      local d = need * p - lv
      local v = (d - d % r) / r
      if v * r < d then v = v + 1 end
      if v > retry then
        retry, bound = v, i
      end
    end
    local d = W[x] * p - lv
    local v = (d - d % r) / r
    if v * r < d then v = v + 1 end
    if v > reset then
      reset = v
    end
  end
  if take then
    -- The key lives until the bucket is full: (reset + back) / 1 ms, rounded up once.
    local rr, rb = reset % 1000, back % 1000
    local ms = (reset - rr) / 1000 + (back - rb) / 1000
    if rr + rb > 1000 then
      ms = ms + 2
    elseif rr + rb > 0 then
      ms = ms + 1
    end
    if ms < 1 then
      ms = 1
    end
    redis.call('SET', KEYS[j], value, 'PX', ms)
  end
  local flags = 2 * conv + 4 * (bound - 1)
  if ok then flags = flags + 1 end
  if #KEYS == 1 then
    if back == 0 and retry == 0 then
      return {flags, remaining, reset}
    end
    return {flags, remaining, reset, retry, back}
  end
  if j == 1 then
    reply = {}
  end
  local y = (j - 1) * 5
  reply[y + 1], reply[y + 2], reply[y + 3], reply[y + 4], reply[y + 5] = flags, remaining, reset, retry, back
  w = w + 6 + 5 * n
end
return reply
