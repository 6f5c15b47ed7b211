-- tokenbucket.lua: the exact token bucket, the twin of tokenbucket's (*State).Step and StepAll,
-- read beside tokenbucket/step.go: the functions and names are Go's. It decides K buckets, each
-- on its own or all or nothing, in integers of at most 2^53.
--
-- KEYS[1..K]  the buckets, one per check
-- ARGV[1]     now, in µs since the Unix epoch, or "" to read the server's TIME (once per call)
-- ARGV[2]     "each": every key is decided on its own, in order, as K calls of one key would
--             decide it (a key named twice sees its own earlier write); "all": every cost is
--             taken when every key is allowed, and none otherwise (the keys distinct, as for
--             StepAll)
-- then two per key, in the order of KEYS:
--   cost      the tokens to take; or, negative, the tokens to ask for without taking any
--             (a peek asks for one: -1)
--   policy    a binary string (struct.pack): the number of limits n (1 byte, 1 to 8), then per
--             limit its capacity c, refill tokens r and refill period p in µs, the rate in lowest
--             terms, as 7-byte big-endian integers. The values are read as doubles: 2^53 + 1
--             reads as 2^53.
--
-- Stored value, a binary string of 8 + 28 bytes per limit (36 for one limit):
--   version (1 byte, 1), last (7 bytes), then per limit: level, c, r, p (7 bytes each)
-- all big-endian. last is the time up to which the bucket is refilled (µs); a level counts in
-- 1/p of a token (level/p whole tokens plus a remainder). Only a check that takes tokens writes;
-- the key expires (PX) once the bucket would be full, rounded up to the millisecond, at least
-- 1 ms. A value of another version is refused as malformed: a release that changes the format
-- gives it a new version number and reads this one, version 1, with its own reader.
--
-- Reply: an array of 1 + 5K integers: the number of integers per key, 5, then per key, in the
-- order of KEYS: flags (1: its own bucket holds the cost; 2: another policy wrote the bucket;
-- plus 4 times the index of the binding limit, from 0), remaining tokens, reset after (µs), retry
-- after (µs), and the clock's catch-up (µs: the bucket's last minus now, when the clock is
-- behind it); or, for a key that has an error, the error in place of its flags (and 0 for the
-- rest). The caller adds the catch-up to each wait that is not 0 (the sum can pass 2^53). A
-- later format can give each key more integers behind the count. In "all" mode a key with an
-- error is not allowed, so nothing is taken.
-- Errors: "ratelimit: invalid argument: malformed argument" (for a key, or for the whole call
-- when ARGV[1] or ARGV[2] is), where the caller has already checked the request (Go's
-- Request.Validate gives the reason); "ratelimit: malformed bucket state: <what>" for a key.
--
-- Exactness: every value is an integer of at most 2^53, and so is every product formed. For
-- 0 <= a <= 2^53 and b >= 1, (a - a % b) / b is floor(a / b) or, only near 2^53, one more,
-- which the test "q * b > a" corrects; the same with "q * b < a" gives the ceiling.
--
-- Cost: Redis runs this body on every call, and every object it makes (a table, a string, a
-- closure, an upvalue, a table that grows) is made and collected again each time, some 500
-- instructions apiece (callgrind). Readability costs here: the five functions below, twins of
-- Go's, are ~5,000 instructions of closures per call, and a key's limits, bands and levels are
-- tables. step returns its reply's integers rather than a table, tables are made at their full
-- size, and a policy string is decoded once per call. Redis instructions per decision of one
-- limit (callgrind): ~88,000 for a call of one key (the unversioned script before it: ~83,000),
-- ~59,000 at 4 keys a call, ~49,000 at 16.

-- arith.CeilDiv: ⌈a/b⌉ for b >= 1, 0 for a <= 0.
local function ceilDiv(a, b)
  if a <= 0 then return 0 end
  local q = (a - a % b) / b
  if q * b < a then q = q + 1 end
  return q
end

-- ⌊a/b⌋ for a >= 0 and b >= 1 (Go's a / b).
local function floorDiv(a, b)
  local q = (a - a % b) / b
  if q * b > a then q = q - 1 end
  return q
end

-- arith.Rate.Refill: level after elapsed µs at l's rate, capped at its capacity.
local function refill(l, level, elapsed)
  local full = l.c * l.p
  local missing = full - level
  if missing <= 0 or elapsed >= ceilDiv(missing, l.r) then
    return full
  end
  return level + elapsed * l.r
end

-- carry: rem/p of a token in units of 1/q, rounded down (see carry in step.go).
local function carry(rem, p, q)
  local d = floorDiv(p, q)
  if d * q == p then return floorDiv(rem, d) end
  d = floorDiv(q, p)
  if d * p == q then return rem * d end
  local v = math.floor(rem / p * q) - 2
  if v < 0 then return 0 end
  return v
end

-- step decides a check of cost (negative: ask, take nothing) of limits on the bucket at key at
-- now, as Step does, and when take is true and it is allowed takes the cost and writes the
-- bucket: it returns the key's 5 integers of the reply (see the header), or nil and its error.
local function step(key, limits, cost, now, take)
  -- (Locals, not upvalues: Redis runs the script's body on every call, and each upvalue is an
  -- object made and collected per call.)
  local MAX, MAXTIME, VERSION = 9007199254740992, 4503599627370496, 1
  local CORRUPT = 'ratelimit: malformed bucket state: '
  local need = cost
  if need < 0 then need = -need end
  local n = #limits
  for i = 1, n do
    if need > limits[i].c then return nil, 'ratelimit: invalid argument: malformed argument' end
  end
  take = take and cost > 0

  -- The stored bucket (DecodeState's rules): each band is its limit's c, r and p, and its level,
  -- refilled at the rate of the limit that wrote it.
  local ok, raw = pcall(redis.call, 'GET', key)
  if not ok then return nil, CORRUPT .. 'not a string' end
  local t0, back, converted, exists = now, 0, false, false
  local bands, m = nil, 0
  if raw then
    local len = #raw
    if len < 36 then return nil, CORRUPT .. 'too short' end
    m = (len - 8) / 28
    if m % 1 ~= 0 or m > 8 then return nil, CORRUPT .. 'wrong number of fields' end
    local v, last = struct.unpack('>BI7', raw)
    if v ~= VERSION then return nil, CORRUPT .. 'unknown version' end
    if last > MAXTIME then return nil, CORRUPT .. 'time out of range' end
    if last > now then
      t0, back = last, last - now
    end
    bands = {false, false, false, false, false, false, false, false} -- (see levels)
    for k = 1, m do
      local level, c, r, p = struct.unpack('>I7I7I7I7', raw, 9 + 28 * (k - 1))
      if c < 1 or r < 1 or p < 1 or c > MAX or r > MAX or p > MAX or c > MAX / p or level > c * p then
        return nil, CORRUPT .. 'field out of range'
      end
      local b = {c = c, r = r, p = p, level = level}
      b.level = refill(b, level, t0 - last)
      if b.level ~= c * p then exists = true end
      bands[k] = b
    end
    if not exists then
      -- Full by now: the same as a missing bucket, decided at now.
      t0, back = now, 0
    end
  end

  -- levels[i]: limit i's level. (Made at its full size, 8: a table that grows is copied.)
  local levels = {false, false, false, false, false, false, false, false}
  if not exists then
    for i = 1, n do
      levels[i] = limits[i].c * limits[i].p
    end
  else
    -- First each limit takes the band it wrote, then each limit left takes the next band left:
    -- a changed limit carries over the band it replaces, at no more than its own capacity. A
    -- limit with no band left takes the bucket's fewest whole tokens.
    local matched = 0
    for i = 1, n do
      local l = limits[i]
      for k = 1, m do
        local b = bands[k]
        if not b.used and b.c == l.c and b.r == l.r and b.p == l.p then
          levels[i], b.used, matched = b.level, true, matched + 1
          break
        end
      end
    end
    converted = matched ~= n or matched ~= m
    local nextband = 1
    for i = 1, n do
      local l = limits[i]
      if not levels[i] then
        while nextband <= m and bands[nextband].used do
          nextband = nextband + 1
        end
        local b, tok = bands[nextband], nil
        if b then
          -- The band it replaces: its whole tokens, and the part of a token it had, in this
          -- limit's units.
          b.used = true
          tok = floorDiv(b.level, b.p)
          if tok < l.c then
            levels[i] = tok * l.p + carry(b.level - tok * b.p, b.p, l.p)
          end
        else
          for k = 1, m do
            local t = floorDiv(bands[k].level, bands[k].p)
            if tok == nil or t < tok then tok = t end
          end
        end
        if not levels[i] then
          if tok > l.c then tok = l.c end
          levels[i] = tok * l.p
        end
      end
    end
  end

  local allowed = true
  for i = 1, n do
    if levels[i] < need * limits[i].p then
      allowed = false
      break
    end
  end
  take = take and allowed
  local remaining, bound, retry, reset = -1, 1, 0, 0
  local value
  if take then
    value = struct.pack('>BI7', VERSION, t0)
  end
  for i = 1, n do
    local l = limits[i]
    if take then
      levels[i] = levels[i] - cost * l.p
      value = value .. struct.pack('>I7I7I7I7', levels[i], l.c, l.r, l.p)
    end
    local tok = floorDiv(levels[i], l.p)
    if remaining < 0 or tok < remaining then
      remaining = tok
      if allowed then bound = i end
    end
    if not allowed and levels[i] < need * l.p then
      local w = ceilDiv(need * l.p - levels[i], l.r)
      if w > retry then
        retry, bound = w, i
      end
    end
    local w = ceilDiv(l.c * l.p - levels[i], l.r)
    if w > reset then reset = w end
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
    if ms < 1 then ms = 1 end
    redis.call('SET', key, value, 'PX', ms)
  end
  local flags = 4 * (bound - 1)
  if allowed then flags = flags + 1 end
  if converted then flags = flags + 2 end
  return flags, remaining, reset, retry, back
end

local MAX, MAXTIME = 9007199254740992, 4503599627370496 -- 2^53, 2^52
local MALFORMED = 'ratelimit: invalid argument: malformed argument'
local now, mode = ARGV[1], ARGV[2]
if #ARGV ~= 2 + 2 * #KEYS or (mode ~= 'each' and mode ~= 'all') then
  return redis.error_reply(MALFORMED)
end
if now == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(now)
  if now == nil or now ~= now or now < 0 or now > MAXTIME or now % 1 ~= 0 then
    return redis.error_reply(MALFORMED)
  end
end

-- "each" decides every key in one pass, taking what it allows. "all" is StepAll: a first pass
-- decides every key without taking, and only when every one is allowed a second pass decides
-- them again, taking their costs.
local reply, policies = {5, 0, 0, 0, 0, 0}, nil -- (made at the size of one key's reply)
if #KEYS > 1 then policies = {} end
local passes, all = 1, true
if mode == 'all' then passes = 2 end
for pass = 1, passes do
  if not all then break end
  for j = 1, #KEYS do
    -- Key j's cost and limits: its policy string decoded once per call (with several keys),
    -- each limit's c, r and p checked by Limit.Validate's rules (which Go has already checked).
    local cost, pol = tonumber(ARGV[1 + 2 * j]), ARGV[2 + 2 * j]
    if cost ~= nil and (cost ~= cost or cost == 0 or cost % 1 ~= 0) then cost = nil end
    local limits = policies and policies[pol]
    if limits == nil then
      limits = false
      local len = #pol
      local n = len >= 22 and struct.unpack('>B', pol)
      if n and n >= 1 and n <= 8 and len == 1 + 21 * n then
        limits = {}
        for i = 1, n do
          local c, r, p = struct.unpack('>I7I7I7', pol, 2 + 21 * (i - 1))
          if c < 1 or r < 1 or p < 1 or c > MAX or r > MAX or p > MAX or c > MAX / p then
            limits = false
            break
          end
          limits[i] = {c = c, r = r, p = p}
        end
      end
      if policies then policies[pol] = limits end
    end
    local y = 2 + 5 * (j - 1)
    local flags, remaining, reset, retry, back
    if cost and limits then
      flags, remaining, reset, retry, back = step(KEYS[j], limits, cost, now, pass == passes)
    else
      remaining = MALFORMED
    end
    if flags then
      reply[y], reply[y + 1], reply[y + 2], reply[y + 3], reply[y + 4] = flags, remaining, reset, retry, back
      all = all and flags % 2 == 1
    else
      reply[y], reply[y + 1], reply[y + 2], reply[y + 3], reply[y + 4] = {err = remaining}, 0, 0, 0, 0
      all = false
    end
  end
end
return reply
