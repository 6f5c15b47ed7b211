-- tokenbucket.lua: the exact token bucket, the twin of ratelimit's (*State).Step.
-- It decides and consumes in one atomic step, in integers below 2^53.
--
-- KEYS[1]   the subject's bucket
-- ARGV[1]   now, in microseconds since the Unix epoch, or "" to read the server's TIME
-- ARGV[2]   cost, the tokens to take (ignored when peeking)
-- ARGV[3]   "1" to peek (take nothing, ask for one token), "0" to take
-- ARGV[4..] the policy, 1 to 8 limits of three values each:
--           capacity, refill tokens, refill period in microseconds
--
-- Stored value, a binary string of 21 bytes for a typical policy: last, then per limit that
-- wrote the bucket its level L and its capacity C, refill tokens R and period P (µs):
--   last (7 bytes, big-endian) { L (7 bytes, big-endian) C R P (each an unsigned LEB128 varint) }
-- last is the time up to which the bucket is refilled (µs); L is in 1/P of a token (L/P whole
-- tokens plus a remainder). The key expires (PX, at least 1 ms) once the bucket would be full.
--
-- Reply: {allowed (1 or 0), remaining tokens, retry after (µs), reset after (µs),
--         index of the binding limit (from 0)}
-- Errors: "ratelimit: invalid argument: <rule>" and "ratelimit: malformed bucket state: <what>".

local MAX = 4503599627370496 -- 2^52: every quantity stays within it, sums within 2^53

local function fail(msg)
  error({err = 'ratelimit: invalid argument: ' .. msg})
end

local function corrupt(msg)
  error({err = 'ratelimit: malformed bucket state: ' .. msg})
end

-- int returns s as a number when it is an integer, else nil.
local function int(s)
  local n = tonumber(s)
  if n == nil or n ~= n or n ~= math.floor(n) or n > 2 * MAX or n < -2 * MAX then
    return nil
  end
  return n
end

-- num returns s as a number, failing with what's name when it is not one.
local function num(s, what)
  local n = tonumber(s)
  if n == nil or n ~= n then
    fail(what .. ' must be a number')
  end
  return n
end

-- divmod returns floor(a/b) and a mod b exactly, for 0 <= a <= 2^52 and 1 <= b <= 2^52.
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q, r = q - 1, r + b
  elseif r >= b then
    q, r = q + 1, r - b
  end
  return q, r
end

-- ceildiv returns ceil(a/b) exactly for a <= 2^52 and 1 <= b <= 2^52 (0 for a <= 0).
local function ceildiv(a, b)
  if a <= 0 then
    return 0
  end
  local q, r = divmod(a, b)
  if r > 0 then
    q = q + 1
  end
  return q
end

local function floordiv(a, b)
  local q = divmod(a, b)
  return q
end

-- The request, checked by Limit.Validate's rules in its order and words (and, where Go's
-- types rule them out, that each value is an integer).
local n = (#ARGV - 3) / 3
if n < 1 or n ~= math.floor(n) then
  fail('a policy needs at least one limit')
end
if n > 8 then
  fail('a policy may combine at most 8 limits')
end
local lc, lr, lp = {}, {}, {}
for i = 1, n do
  local prefix = ''
  if n > 1 then
    prefix = 'limit ' .. (i - 1) .. ': '
  end
  local c = num(ARGV[1 + 3 * i], prefix .. 'capacity')
  local r = num(ARGV[2 + 3 * i], prefix .. 'refill tokens')
  local p = num(ARGV[3 + 3 * i], prefix .. 'refill period')
  if c < 1 then fail(prefix .. 'capacity must be at least 1') end
  if c ~= math.floor(c) then fail(prefix .. 'capacity must be an integer') end
  if r < 1 then fail(prefix .. 'refill tokens must be at least 1') end
  if r ~= math.floor(r) then fail(prefix .. 'refill tokens must be an integer') end
  if p < 1 then fail(prefix .. 'refill period must be at least 1µs') end
  if p ~= math.floor(p) then fail(prefix .. 'refill period must be a whole number of microseconds') end
  if c * p > MAX then fail(prefix .. 'capacity * refill period in µs must be at most 2^52') end
  if r > MAX then fail(prefix .. 'refill tokens must be at most 2^52') end
  lc[i], lr[i], lp[i] = c, r, p
end
local peek = ARGV[3]
if peek ~= '0' and peek ~= '1' then
  fail('peek must be 0 or 1')
end
peek = peek == '1'
local cost = 1
if not peek then
  cost = num(ARGV[2], 'cost')
  if cost < 1 then fail('cost must be at least 1') end
  if cost ~= math.floor(cost) then fail('cost must be an integer') end
  for i = 1, n do
    if cost > lc[i] then fail('cost must not exceed capacity') end
  end
end
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = num(ARGV[1], 'time')
end
if now < 0 or now > MAX then
  fail('time must be between the Unix epoch and 2^52 µs after it')
end
if now ~= math.floor(now) then
  fail('time must be a whole number of microseconds')
end

-- uvarintenc encodes n, an integer from 0 to 2^52, as an unsigned LEB128 varint.
local function uvarintenc(n)
  if n < 128 then
    return string.char(n)
  elseif n < 16384 then
    local q = floordiv(n, 128)
    return string.char(n - q * 128 + 128, q)
  elseif n < 2097152 then
    local q1 = floordiv(n, 128)
    local q2 = floordiv(q1, 128)
    return string.char(n - q1 * 128 + 128, q1 - q2 * 128 + 128, q2)
  end
  local b = {}
  while n >= 128 do
    local q, r = divmod(n, 128)
    b[#b + 1] = r + 128
    n = q
  end
  b[#b + 1] = n
  return string.char(unpack(b))
end

local key = KEYS[1]

-- The fast path: one limit, and a bucket that this limit wrote or none. It is the general
-- path below restricted to that case, on plain numbers instead of tables and loops; it
-- returns nil for anything else (another policy, several limits, a value it cannot read),
-- and the general path decides.
local function fastpath()
  local C, R, P = lc[1], lr[1], lp[1]
  local full = C * P
  local penc = uvarintenc(C) .. uvarintenc(R) .. uvarintenc(P)
  local ok, raw = pcall(redis.call, 'GET', key)
  if not ok then
    return nil
  end
  local exists, last, L = false, 0, 0
  if raw then
    if #raw ~= 14 + #penc or string.sub(raw, 15) ~= penc then
      return nil
    end
    last, L = struct.unpack('>I7I7', raw)
    if last > MAX or L > full then
      return nil
    end
    exists = true
  end
  local t0, back = now, 0
  if exists then
    if last > now then
      t0, back = last, last - now
    elseif now - last >= ceildiv(full - L, R) then
      exists = false
    end
  end
  local level = full
  if exists then
    local missing = full - L
    if missing > 0 and t0 - last < ceildiv(missing, R) then
      level = L + (t0 - last) * R
    end
  end
  local need = cost * P
  local a, retry = 0, 0
  if level >= need then
    a = 1
    if not peek then
      level = level - need
    end
  else
    retry = ceildiv(need - level, R) + back
  end
  local reset = ceildiv(full - level, R)
  local ttl = math.max(1, ceildiv(reset, 1000) + ceildiv(back, 1000))
  if exists or not peek then
    redis.call('SET', key, struct.pack('>I7I7', t0, level) .. penc, 'PX', ttl)
  end
  return {a, floordiv(level, P), retry, reset + back, 0}
end

if n == 1 then
  local res = fastpath()
  if res then
    return res
  end
end

-- The general path.
-- The stored bucket.
local ok, raw = pcall(redis.call, 'GET', key)
if not ok then
  corrupt('not a string')
end
local exists = false
local last = 0
local sl, sc, sr, sp = {}, {}, {}, {}

-- uvarint reads an unsigned LEB128 varint of at most 8 bytes at pos; it returns the number and
-- the next position, or nil.
local function uvarint(s, pos)
  local n, mul = 0, 1
  for i = pos, pos + 7 do
    local b = string.byte(s, i)
    if b == nil then
      return nil
    end
    n = n + (b % 128) * mul
    if b < 128 then
      return n, i + 1
    end
    mul = mul * 128
  end
  return nil
end

if raw then
  if #raw < 14 then
    corrupt('too short')
  end
  local pos
  last, pos = struct.unpack('>I7', raw, 1)
  if last > MAX then
    corrupt('time out of range')
  end
  local m = 0
  while pos <= #raw do
    m = m + 1
    if m > 8 or pos + 6 > #raw then
      corrupt('wrong number of fields')
    end
    local l, c, r, p
    l, pos = struct.unpack('>I7', raw, pos)
    c, pos = uvarint(raw, pos)
    if c then r, pos = uvarint(raw, pos) end
    if r then p, pos = uvarint(raw, pos) end
    if p == nil then
      corrupt('truncated limit')
    end
    if c < 1 or r < 1 or p < 1 or c * p > MAX or r > MAX or l > c * p then
      corrupt('field out of range')
    end
    sl[m], sc[m], sr[m], sp[m] = l, c, r, p
  end
  exists = true
end

local t0, back = now, 0
if exists then
  if last > now then
    t0, back = last, last - now
  else
    local elapsed = now - last
    local full = true
    for j = 1, #sl do
      if elapsed < ceildiv(sc[j] * sp[j] - sl[j], sr[j]) then
        full = false
        break
      end
    end
    if full then
      exists = false
    end
  end
end

local levels = {}
if not exists then
  for i = 1, n do
    levels[i] = lc[i] * lp[i]
  end
else
  local elapsed = t0 - last
  local fewest = -1
  for j = 1, #sl do
    local tok = floordiv(sl[j], sp[j])
    if fewest < 0 or tok < fewest then
      fewest = tok
    end
  end
  -- First each limit takes the band it wrote, then each limit left takes the next band left;
  -- a limit with no band left takes the bucket's fewest whole tokens.
  local used, match = {}, {}
  for i = 1, n do
    for j = 1, #sl do
      if not used[j] and sc[j] == lc[i] and sr[j] == lr[i] and sp[j] == lp[i] then
        match[i], used[j] = j, true
        break
      end
    end
  end
  local nextband = 1
  for i = 1, n do
    local j = match[i]
    if j then
      local full = lc[i] * lp[i]
      local missing = full - sl[j]
      if missing <= 0 or elapsed >= ceildiv(missing, lr[i]) then
        levels[i] = full
      else
        levels[i] = sl[j] + elapsed * lr[i]
      end
    else
      local tok = fewest
      while nextband <= #sl and used[nextband] do
        nextband = nextband + 1
      end
      if nextband <= #sl then
        tok, used[nextband] = floordiv(sl[nextband], sp[nextband]), true
      end
      levels[i] = math.min(tok, lc[i]) * lp[i]
    end
  end
end

local allowed = true
for i = 1, n do
  if levels[i] < cost * lp[i] then
    allowed = false
    break
  end
end
local bound, retry, reset, remaining = 1, 0, 0, -1
if allowed then
  for i = 1, n do
    if not peek then
      levels[i] = levels[i] - cost * lp[i]
    end
    local tok = floordiv(levels[i], lp[i])
    if remaining < 0 or tok < remaining then
      remaining, bound = tok, i
    end
  end
else
  retry = -1
  for i = 1, n do
    local tok = floordiv(levels[i], lp[i])
    if remaining < 0 or tok < remaining then
      remaining = tok
    end
    local need = cost * lp[i]
    if levels[i] < need then
      local w = ceildiv(need - levels[i], lr[i])
      if w > retry then
        retry, bound = w, i
      end
    end
  end
  retry = retry + back
end
for i = 1, n do
  reset = math.max(reset, ceildiv(lc[i] * lp[i] - levels[i], lr[i]))
end
local ttl = math.max(1, ceildiv(reset, 1000) + ceildiv(back, 1000))
reset = reset + back

if exists or not peek then
  local parts = {struct.pack('>I7', t0)}
  for i = 1, n do
    parts[#parts + 1] = struct.pack('>I7', levels[i]) .. uvarintenc(lc[i]) .. uvarintenc(lr[i]) .. uvarintenc(lp[i])
  end
  redis.call('SET', key, table.concat(parts), 'PX', string.format('%.0f', ttl))
end

local a = 0
if allowed then a = 1 end
return {a, remaining, retry, reset, bound - 1}
