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
-- Reply: an array of K entries, one per key in the order of KEYS: an array of 5 integers
-- (flags: 1 its own bucket holds the cost, 2 another policy wrote the bucket, plus 4 times the
-- index of the binding limit, from 0; remaining tokens; reset after (µs); retry after (µs); the
-- clock's catch-up (µs: the bucket's last minus now, when the clock is behind it)), or the
-- key's error. The caller adds the catch-up to each wait that is not 0 (the sum can pass 2^53).
-- In "all" mode a key with an error is not allowed, so nothing is taken.
-- Errors: "ratelimit: invalid argument: malformed argument" (for a key, or for the whole call
-- when ARGV[1] or ARGV[2] is), where the caller has already checked the request (Go's
-- Request.Validate gives the reason); "ratelimit: malformed bucket state: <what>" for a key.
--
-- Exactness: every value is an integer of at most 2^53, and so is every product formed. For
-- 0 <= a <= 2^53 and b >= 1, (a - a % b) / b is floor(a / b) or, only near 2^53, one more,
-- which the test "q * b > a" corrects; the same with "q * b < a" gives the ceiling.
--
-- Cost (callgrind, Redis instructions per decision, one limit): the functions below cost a few
-- hundred instructions per key over the same code written inline; the policy of a call is
-- decoded once per distinct policy string.

local MAX = 9007199254740992     -- 2^53
local MAXTIME = 4503599627370496 -- 2^52
local VERSION = 1
local MALFORMED = 'ratelimit: invalid argument: malformed argument'
local CORRUPT = 'ratelimit: malformed bucket state: '
local floor, unpack, pack = math.floor, struct.unpack, struct.pack

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
  local v = floor(rem / p * q) - 2
  if v < 0 then return 0 end
  return v
end

-- A limit's values are exact: Limit.Validate's rules, which Go has already checked.
local function exact(c, r, p)
  return c >= 1 and r >= 1 and p >= 1 and c <= MAX and r <= MAX and p <= MAX and c <= MAX / p
end

-- policyOf decodes a policy argument into its limits {c, r, p}, or nil when it is malformed.
local function policyOf(pol)
  local n = #pol
  if n < 22 then return nil end
  local m, c, r, p = unpack('>BI7I7I7', pol)
  if m < 1 or m > 8 or n ~= 1 + 21 * m then return nil end
  local limits = {}
  for i = 1, m do
    if i > 1 then
      c, r, p = unpack('>I7I7I7', pol, 2 + 21 * (i - 1))
    end
    if not exact(c, r, p) then return nil end
    limits[i] = {c = c, r = r, p = p}
  end
  return limits
end

-- bandsOf decodes a stored value into its last and its bands {l = {c, r, p}, level}, or nil and
-- what is wrong with it (DecodeState's rules).
local function bandsOf(raw)
  local n = #raw
  if n < 36 then return nil, 'too short' end
  if (n - 8) % 28 ~= 0 or n > 8 + 28 * 8 then return nil, 'wrong number of fields' end
  local v, last = unpack('>BI7', raw)
  if v ~= VERSION then return nil, 'unknown version' end
  if last > MAXTIME then return nil, 'time out of range' end
  local bands = {}
  for k = 1, (n - 8) / 28 do
    local level, c, r, p = unpack('>I7I7I7I7', raw, 9 + 28 * (k - 1))
    if not exact(c, r, p) or level > c * p then return nil, 'field out of range' end
    bands[k] = {l = {c = c, r = r, p = p}, level = level}
  end
  return last, bands
end

-- step decides a check of cost (negative: ask, take nothing) on the bucket raw (false: none) at
-- now, as Step does, up to the decision: it returns the key's state {limits, cost, need, levels,
-- t0, back, converted, allowed}, or nil and the error.
local function step(limits, cost, raw, now)
  local need = cost
  if need < 0 then need = -need end
  for i = 1, #limits do
    if need > limits[i].c then return nil, MALFORMED end
  end
  local s = {limits = limits, cost = cost, need = need, levels = {}, t0 = now, back = 0, converted = false}
  local levels = s.levels
  local exists = false
  local stored, bands = {}, nil
  if raw then
    local last, what = bandsOf(raw)
    if not last then return nil, CORRUPT .. what end
    bands = what
    if last > now then
      s.t0, s.back = last, last - now
    end
    exists = false
    for k = 1, #bands do
      local b = bands[k]
      stored[k] = refill(b.l, b.level, s.t0 - last)
      if stored[k] ~= b.l.c * b.l.p then exists = true end
    end
    if not exists then
      -- Full by now: the same as a missing bucket, decided at now.
      s.t0, s.back = now, 0
    end
  end

  if not exists then
    for i = 1, #limits do
      local l = limits[i]
      levels[i] = l.c * l.p
    end
  else
    local m = #bands
    local fewest = -1
    for k = 1, m do
      local tok = floorDiv(stored[k], bands[k].l.p)
      if fewest < 0 or tok < fewest then fewest = tok end
    end
    -- First each limit takes the band it wrote, then each limit left takes the next band left:
    -- a changed limit carries over the band it replaces, at no more than its own capacity. A
    -- limit with no band left takes the bucket's fewest whole tokens.
    local used, match, matched = {}, {}, 0
    for i = 1, #limits do
      local l = limits[i]
      for k = 1, m do
        local h = bands[k].l
        if not used[k] and h.c == l.c and h.r == l.r and h.p == l.p then
          match[i], used[k], matched = k, true, matched + 1
          break
        end
      end
    end
    s.converted = matched ~= #limits or matched ~= m
    local nextband = 1
    for i = 1, #limits do
      local l = limits[i]
      if match[i] then
        levels[i] = stored[match[i]]
      else
        local tok = fewest
        while nextband <= m and used[nextband] do
          nextband = nextband + 1
        end
        if nextband <= m then
          -- The band it replaces: its whole tokens, and the part of a token it had, in this
          -- limit's units.
          used[nextband] = true
          local hp = bands[nextband].l.p
          tok = floorDiv(stored[nextband], hp)
          if tok < l.c then
            levels[i] = tok * l.p + carry(stored[nextband] - tok * hp, hp, l.p)
          end
        end
        if not levels[i] then
          if tok > l.c then tok = l.c end
          levels[i] = tok * l.p
        end
      end
    end
  end

  s.allowed = true
  for i = 1, #limits do
    if levels[i] < need * limits[i].p then
      s.allowed = false
      break
    end
  end
  return s
end

-- finish takes the cost from s's bands when take is true and writes the bucket at key, and
-- returns the key's reply (see the header).
local function finish(s, key, take)
  local limits, levels = s.limits, s.levels
  local remaining, bound, retry, reset = -1, 1, 0, 0
  local value
  if take then
    value = pack('>BI7', VERSION, s.t0)
  end
  for i = 1, #limits do
    local l = limits[i]
    if take then
      levels[i] = levels[i] - s.cost * l.p
      value = value .. pack('>I7I7I7I7', levels[i], l.c, l.r, l.p)
    end
    local tok = floorDiv(levels[i], l.p)
    if remaining < 0 or tok < remaining then
      remaining = tok
      if s.allowed then bound = i end
    end
    if not s.allowed and levels[i] < s.need * l.p then
      local w = ceilDiv(s.need * l.p - levels[i], l.r)
      if w > retry then
        retry, bound = w, i
      end
    end
    local w = ceilDiv(l.c * l.p - levels[i], l.r)
    if w > reset then reset = w end
  end
  if take then
    -- The key lives until the bucket is full: (reset + back) / 1 ms, rounded up once.
    local rr, rb = reset % 1000, s.back % 1000
    local ms = (reset - rr) / 1000 + (s.back - rb) / 1000
    if rr + rb > 1000 then
      ms = ms + 2
    elseif rr + rb > 0 then
      ms = ms + 1
    end
    if ms < 1 then ms = 1 end
    redis.call('SET', key, value, 'PX', ms)
  end
  local flags = 4 * (bound - 1)
  if s.allowed then flags = flags + 1 end
  if s.converted then flags = flags + 2 end
  return {flags, remaining, reset, retry, s.back}
end

-- check decodes key j's arguments and reads its bucket: the key's state, or nil and its error.
-- policies keeps the limits of each policy string of the call, decoded once.
local function check(j, now, policies)
  local cost, pol = tonumber(ARGV[1 + 2 * j]), ARGV[2 + 2 * j]
  if cost == nil or cost ~= cost or cost == 0 or cost % 1 ~= 0 or pol == nil then
    return nil, MALFORMED
  end
  local limits = policies[pol]
  if limits == nil then
    limits = policyOf(pol) or false
    policies[pol] = limits
  end
  if not limits then return nil, MALFORMED end
  local ok, raw = pcall(redis.call, 'GET', KEYS[j])
  if not ok then return nil, CORRUPT .. 'not a string' end
  return step(limits, cost, raw, now)
end

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

local policies, reply = {}, {}
if mode == 'each' then
  for j = 1, #KEYS do
    local s, err = check(j, now, policies)
    if s then
      reply[j] = finish(s, KEYS[j], s.allowed and s.cost > 0)
    else
      reply[j] = {err = err}
    end
  end
  return reply
end

-- All or nothing: every key is decided before any is taken.
local states, all = {}, true
for j = 1, #KEYS do
  local s, err = check(j, now, policies)
  states[j] = s or err
  all = all and s ~= nil and s.allowed
end
for j = 1, #KEYS do
  local s = states[j]
  if type(s) == 'string' then
    reply[j] = {err = s}
  else
    reply[j] = finish(s, KEYS[j], all and s.cost > 0)
  end
end
return reply
