-- tokenbucket.lua: the exact token bucket, the twin of tokenbucket's (*State).Step, StepAll and
-- Settle, read beside tokenbucket/step.go: the functions and names are Go's. It decides K buckets,
-- each on its own or in all-or-nothing groups, and reserves and settles, in integers of at most
-- 2^53.
--
-- KEYS[1..K]  the buckets, one per check; for "reserve" and "settle", the bucket and then its
--             reservation's record (a key in the bucket's slot); for "settle" by the record alone,
--             the record, which names its bucket
-- ARGV[1]     now, in µs since the Unix epoch, or "" to read the server's TIME (once per call)
-- ARGV[2]     the mode:
--   "each"    every key is decided on its own, in order, as K calls of one key would decide it
--             (a key named twice sees its own earlier write);
--   "all"     every cost is taken when every key is allowed, and none otherwise (the keys
--             distinct, as for StepAll);
--   "3,1,2"   groups of consecutive keys, their sizes adding up to K: each group is decided as
--             "all" decides its keys, each independently of the others, in order;
--   "reserve" KEYS[1] is decided as "each" decides it, and when allowed the record KEYS[2] is
--             written: what each limit took, and KEYS[1], kept for ARGV[5] ms;
--   "settle"  the record KEYS[2] is read and deleted, and what it holds settled on KEYS[1] as
--             Settle does with the actual costs; without a record, or with one of another
--             bucket, nothing changes, and the reply says so (flag 8). With one key, KEYS[1] is
--             the record and ARGV[5] a prefix: the bucket is the one the record names, when its
--             key starts with the prefix (the limiter's namespace); without such a record nothing
--             changes, and the reply is flag 8 and zeros. (The bucket is a key the call does not
--             declare: the record's slot is the bucket's, which Redis Cluster allows.)
--   "refund"  the costs of KEYS[1] (one key) are given back, capped at capacity: Settle of a
--             reservation of those costs that used nothing (Envoy's negative hits).
-- then two per bucket, in the order of KEYS:
--   cost      the tokens to take from every limit and quota, or a list "c1,c2,..." of one per
--             limit and then one per quota; or, negative (every one of a list), the tokens to ask
--             for without taking any (a peek asks for one: -1).
--             For "settle", the tokens used (0 and up), one for all or one per limit and quota.
--   policy    a binary string (struct.pack): the number of limits n (1 byte, 1 to 8), then per
--             limit its capacity c, refill tokens r and refill period p in µs, the rate in lowest
--             terms, as 7-byte big-endian integers; then, for a policy with quotas, their number
--             q (1 byte, n + q at most 8) and per quota its allowance a and four times in µs
--             (two's complement): the previous window's start ps, the window's start s and end
--             e, and the next window's end ne, around the caller's clock. A check decides each
--             quota in the window of the three that holds the time it is decided at (Go's
--             calendar finds them: the script cannot read the tz database). The values are read
--             as doubles: 2^53 + 1 reads as 2^53.
-- and for "reserve" ARGV[5], the record's lifetime in ms; for "settle" with one key, ARGV[5] the
-- prefix of the bucket's key.
--
-- Stored value, a binary string of 8 + 28 bytes per limit (36 for one limit):
--   version (1 byte), last (7 bytes), then per limit: level, c, r, p (7 bytes each)
-- all big-endian; or, for a policy with quotas, version 3: version, last, the number of limits
-- and of quotas (1 byte each), per limit level, c, r, p, then per quota its window's start and
-- end (two's complement) and the tokens it used in that window (7 bytes each). last is the time up to which the bucket is refilled (µs); a level counts in
-- 1/p of a token (level/p whole tokens plus a remainder), two's complement: below zero only in
-- debt, down to -debt(c)·p (see Debt in arith.go). Version 1 has no band in debt, and is the
-- format of releases without debt; version 2 has one, so that those releases refuse it as
-- malformed rather than misread it. Only a check that takes tokens, or a settle that changes a
-- level, or a check that converts a bucket another policy wrote, writes; the key expires (PX) once the bucket would be full, rounded up to the
-- millisecond, at least 1 ms, and while a quota has used anything, until its window's end. A
-- value of another version is refused as malformed.
--
-- Record, a binary string: version (1 byte, 2), the number of limits n (1 byte, 1 to 8), then per
-- limit of the policy that reserved: tokens, c, r, p (7 bytes each), what it took from the band of
-- that limit; then the bucket's key (the rest, at least a byte). A policy with quotas writes
-- version 3: version, n, the number of quotas q (1 byte each), the limits as version 2 has them,
-- then per quota tokens, and its window's start and end, then the bucket's key. (Version 1, of releases whose
-- record key named the bucket, held no key; its records are never read.)
--
-- and for a call of several keys ("each", "all" or groups), W (below) after the keys' part, when
-- it is not 5.
--
-- Reply: 1 + WK integers, packed in a string when no key has an error (W in a byte, then each
-- integer in 7 bytes, big-endian), else an array: the number of integers per key, W, then per
-- key, in the order of KEYS (for "reserve" and "settle", one key: the bucket): flags (1: its own bucket
-- holds the cost, or for a settle a token; 2: another policy wrote the bucket; 8: a settle found
-- no record; plus 16 times the index of the binding limit or quota, from 0, limits first),
-- remaining tokens, reset after (µs), retry after (µs), and the clock's catch-up (µs: the
-- bucket's last minus now, when the clock is behind it); or, for a key that has an error, the
-- error in place of its flags (and 0 for the rest; only the array form holds one). W is 5 when every key's policy is one
-- limit; otherwise 5 + 2P, P the most limits and quotas of a key's policy, and each key of a
-- policy of more than one has, after its 5, per limit and then per quota its remaining tokens
-- and its reset after (µs; for a quota, until its window's end), and zeros after those. The
-- caller adds the catch-up to each wait that is not 0 (the sum can pass 2^53). In a group a key
-- with an error is not allowed, so nothing is taken.
-- Errors: "ratelimit: invalid argument: malformed argument" (for a key, or for the whole call
-- when ARGV[1], ARGV[2] or the number of arguments is), where the caller has already checked the
-- request (Go's Request.Validate gives the reason); "ratelimit: malformed bucket state: <what>"
-- for a key, or for a record.
--
-- Exactness: every value is an integer of at most 2^53 in magnitude, and so is every product
-- formed. For -2^53 <= a <= 2^53 and b >= 1, (a - a % b) / b is floor(a / b) or, only near
-- 2^53, one more, which the test "q * b > a" corrects; the same with "q * b < a" gives the
-- ceiling.
--
-- How it runs: as a function library (FUNCTION LOAD, then FCALL; Redis 7 and later), its code
-- runs once, at the load, and registers main as the function NAME, which the line redisstore
-- puts before this file defines (the library's name, which names its version). As a script
-- (EVAL; Redis 6, or a server that refuses functions), the same code is the body of every call,
-- and its last line runs main. The difference is the cost: every object the code makes (a
-- function, a table, a string) costs some 500 instructions (callgrind) and is collected again,
-- so a library makes its functions, constants and the memo of decoded policies once, where a
-- script makes them on every call; and step returns its reply's integers rather than a table.
-- Redis instructions per decision: see docs/performance.md.

local MAX, MAXTIME = 9007199254740992, 4503599627370496 -- 2^53, 2^52
local MALFORMED = 'ratelimit: invalid argument: malformed argument'
local CORRUPT = 'ratelimit: malformed bucket state: '

-- The functions of Redis's Lua that the usual call's path (main, plain, step1, px, packed) calls,
-- bound to these locals by main's first call: a function of a library reads a global through two
-- tables (its globals are an empty table whose metatable indexes Redis's) and then its field, where
-- a local is one step (1,550 instructions fewer a call of one key, 1,150 a decision at 16); the
-- library's code cannot read them while it loads. The general path reads them as globals: as a
-- script (EVAL), every local a function captures costs each call a search of the open upvalues, so
-- only the usual path's functions capture them.
local rcall, rpcall, spack, sunpack, sformat, spread, typeof

-- arith.CeilDiv: ⌈a/b⌉ for b >= 1, 0 for a <= 0.
local function ceilDiv(a, b)
  if a <= 0 then return 0 end
  local q = (a - a % b) / b
  if q * b < a then q = q + 1 end
  return q
end

-- arith.FloorDiv: ⌊a/b⌋ for b >= 1, below zero too.
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

-- px returns a key's expiry, SET's PX: (reset + wait) µs in ms, rounded up once, at least 1 ms,
-- as a decimal integer (Lua's tostring would write a large one in exponent form).
local function px(reset, wait)
  local rr, rb = reset % 1000, wait % 1000
  local ms = (reset - rr) / 1000 + (wait - rb) / 1000
  if rr + rb > 1000 then
    ms = ms + 2
  elseif rr + rb > 0 then
    ms = ms + 1
  end
  if ms < 1 then ms = 1 end
  return sformat('%d', ms)
end

-- window returns the start and end of quota q's window, of the three the caller gave around its
-- clock (the previous, its own, the next), that holds t; or nil when none does.
local function window(q, t)
  if q.s <= t and t < q.e then return q.s, q.e end
  if q.ps <= t and t < q.s then return q.ps, q.s end
  if q.e <= t and t < q.ne then return q.e, q.ne end
  return nil
end

-- scratch is the table of step's levels, one per library: step runs one key at a time and keeps
-- nothing in it past its return, so it is made once rather than for every key (a table made and
-- collected costs some 1,000 instructions). scratchBands holds the tables of a stored bucket's bands,
-- read into them by step (the first m of them, m its number of bands), for the same reason. Each is
-- made when first needed: as a script (EVAL) this code runs on every call, and a table it made up
-- front would be made for every call, needed or not.
local scratch, scratchBands

-- step decides a check of limits on the bucket at key at now, as Step does: cost is what every
-- limit asks for (negative: ask, take nothing), or costs[i] limit i's; when take is true and it
-- is allowed it takes the costs and writes the bucket. With held (a record's limits and tokens)
-- it settles instead, as Settle does: costs[i] or cost is what limit i used. It returns the
-- key's 5 integers of the reply (see the header), or nil and its error; for a policy of more
-- than one limit or quota it writes the standing of each into reply after the key's 5, from
-- reply[y + 5]. Each quota's window and count of this call are left in the quota's own table
-- (ws, we and u: a table made per call costs some 500 instructions; the memo's quota tables
-- are the call's own while it runs).
local function step(key, limits, cost, costs, now, take, held, reply, y)
  local n, quotas, nq = #limits, limits.quotas, 0
  for i = 1, n do
    local l, c = limits[i], cost
    if costs then c = costs[i] end
    if c < 0 then c = -c end
    if not held and c > l.c then return nil, MALFORMED end
  end
  if quotas then
    -- (Every quota's code is under a test of quotas: a policy without any pays nothing for it.)
    nq = #quotas
    for j = 1, nq do
      local c = cost
      if costs then c = costs[n + j] end
      if c < 0 then c = -c end
      if not held and c > quotas[j].a then return nil, MALFORMED end
    end
  end
  take = take and cost > 0 and not held

  -- The stored bucket (DecodeState's rules): each band is its limit's c, r and p, and its level,
  -- refilled at the rate of the limit that wrote it.
  local raw = redis.pcall('GET', key)
  if raw and type(raw) ~= 'string' then return nil, CORRUPT .. 'not a string' end
  local t0, back, converted, exists = now, 0, false, false
  local bands, m = nil, 0
  local qat, sq = 0, 0 -- where the stored quota bands start, and how many there are
  local s1, e1, u1 -- the first stored quota band (read once, for the usual one)
  if raw then
    local len = #raw
    if len < 36 then return nil, CORRUPT .. 'too short' end
    local v, last = struct.unpack('>BI7', raw)
    local first = 9 -- where the bands start
    if v == 3 then
      m, sq = struct.unpack('>BB', raw, 9)
      if m < 1 or sq < 1 or m + sq > 8 or len ~= 10 + 28 * m + 21 * sq then
        return nil, CORRUPT .. 'wrong number of fields'
      end
      first = 11
    else
      m = (len - 8) / 28
      if m % 1 ~= 0 or m > 8 then return nil, CORRUPT .. 'wrong number of fields' end
      if v ~= 1 and v ~= 2 then return nil, CORRUPT .. 'unknown version' end
    end
    if last > MAXTIME then return nil, CORRUPT .. 'time out of range' end
    if last > now then
      t0, back = last, last - now
    end
    if sq > 0 then
      -- The quota bands: each window's start and end, and what it used. One that used something
      -- in a window that holds t0 keeps the bucket from being the same as a missing one.
      qat = first + 28 * m
      for k = 1, sq do
        local s, e, u = struct.unpack('>i7i7I7', raw, qat + 21 * (k - 1))
        if s >= e or s < -MAX or e > MAX or u > MAX then return nil, CORRUPT .. 'field out of range' end
        if u > 0 and s <= t0 and t0 < e then exists = true end
        if k == 1 then s1, e1, u1 = s, e, u end
      end
    end
    bands = scratchBands
    if not bands then
      bands = {}
      scratchBands = bands
    end
    local debt = false
    for k = 1, m do
      local level, c, r, p = struct.unpack('>i7I7I7I7', raw, first + 28 * (k - 1))
      if c < 1 or r < 1 or p < 1 or c > MAX or r > MAX or p > MAX or c > MAX / p or level > c * p then
        return nil, CORRUPT .. 'field out of range'
      end
      local b = bands[k]
      if not b then
        b = {}
        bands[k] = b
      end
      b.c, b.r, b.p, b.level, b.used = c, r, p, level, nil
      if level < 0 then
        if level < -math.min(c, floorDiv(MAX - c * p, p)) * p then -- (beyond the debt floor)
          return nil, CORRUPT .. 'field out of range'
        end
        debt = true
      end
      b.level = refill(b, level, t0 - last)
      if b.level ~= c * p then exists = true end
    end
    if v ~= 3 and debt ~= (v == 2) then return nil, CORRUPT .. 'field out of range' end
    if not exists then
      -- Full by now: the same as a missing bucket, decided at now.
      t0, back = now, 0
    end
  end

  -- levels[i]: limit i's level, in the table every step shares (see scratch), emptied first.
  local levels = scratch
  if not levels then
    levels = {false} -- (a slot for the one limit of most policies: a table that grows is copied)
    scratch = levels
  end
  if not exists then
    for i = 1, n do
      levels[i] = limits[i].c * limits[i].p
    end
  else
    for i = 1, n do
      levels[i] = nil
    end
    -- First each limit takes the band it wrote, then each limit left takes the next band left:
    -- a changed limit carries over the band it replaces, at no more than its own capacity and
    -- no deeper in debt than its own floor. A limit with no band left takes the bucket's fewest
    -- whole tokens.
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
    if converted then
      -- carry: rem/p of a token in units of 1/q, rounded down (see carry in step.go). (Made
      -- here, where a policy changed, rather than on every call.)
      local function carry(rem, p, q)
        local d = floorDiv(p, q)
        if d * q == p then return floorDiv(rem, d) end
        d = floorDiv(q, p)
        if d * p == q then return rem * d end
        local v = math.floor(rem / p * q) - 2
        if v < 0 then return 0 end
        return v
      end
      local nextband = 1
      for i = 1, n do
        local l = limits[i]
        if not levels[i] then
          local debt = math.min(l.c, floorDiv(MAX - l.c * l.p, l.p)) -- (arith.Rate.Debt)
          while nextband <= m and bands[nextband].used do
            nextband = nextband + 1
          end
          local b, tok = nil, nil
          if nextband <= m then b = bands[nextband] end
          if b then
            -- The band it replaces: its whole tokens (rounded down, so a debt is never
            -- forgiven), and the part of a token it had, in this limit's units.
            b.used = true
            tok = floorDiv(b.level, b.p)
            if tok < l.c and tok >= -debt then
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
            if tok < -debt then tok = -debt end
            levels[i] = tok * l.p
          end
        end
      end
    end
  end

  -- Each quota's window, of the three the caller gave, that holds t0, and what the quota band of
  -- that window used (the first not taken, in order), or nothing (loadQuotas in quota.go).
  if quotas then
    local taken = 0 -- the stored quota bands taken: bit k-1 for band k
    for j = 1, nq do
      local q = quotas[j]
      local s, e = window(q, t0)
      if not s then
        return nil, 'ratelimit: the server\'s clock is more than a quota window away from the caller\'s'
      end
      q.ws, q.we, q.u = s, e, 0
      local bit = 1
      for k = 1, sq do
        if taken % (2 * bit) < bit then
          local bs, be, bu = s1, e1, u1
          if k > 1 then bs, be, bu = struct.unpack('>i7i7I7', raw, qat + 21 * (k - 1)) end
          if bs == s and be == e then
            q.u, taken = bu, taken + bit
            break
          end
        end
        bit = 2 * bit
      end
    end
  end

  local write = false
  if held then
    -- Settle: each limit that the record took from gets its difference, an overrun down to its
    -- debt floor, a refund up to full (settled in step.go).
    for i = 1, n do
      local l = limits[i]
      for j = 1, #held do
        local h = held[j]
        if not h.used and not h.q and h.c == l.c and h.r == l.r and h.p == l.p then
          h.used = true
          local c = cost
          if costs then c = costs[i] end
          local debt = math.min(l.c, floorDiv(MAX - l.c * l.p, l.p)) -- (arith.Rate.Debt)
          local delta, full, floor, level = c - h.tokens, l.c * l.p, -debt * l.p, levels[i]
          if delta > 0 then
            if delta >= l.c + debt or level - floor <= delta * l.p then
              level = floor
            else
              level = level - delta * l.p
            end
          elseif delta < 0 then
            if -delta >= l.c + debt or full - level <= -delta * l.p then
              level = full
            else
              level = level - delta * l.p
            end
          end
          if level ~= levels[i] then levels[i], write = level, true end
          break
        end
      end
    end
    -- Each quota that the record took from in this window gets its difference, never below
    -- zero and up to 2^53 (Settle in step.go).
    if quotas then for j = 1, nq do
      for k = 1, #held do
        local h = held[k]
        local q = quotas[j]
        if not h.used and h.q and (h.cur or h.s == q.ws and h.e == q.we) then
          h.used = true
          local c = cost
          if costs then c = costs[n + j] end
          local u = q.u + c - h.tokens
          if u < 0 then u = 0 end
          if u > MAX then u = MAX end
          if u ~= q.u then q.u, write = u, true end
          break
        end
      end
    end end
    cost, costs = -1, nil -- the standing after it, as a peek reports it
  end

  local allowed = true
  for i = 1, n do
    local need = cost
    if costs then need = costs[i] end
    if need < 0 then need = -need end
    if levels[i] < need * limits[i].p then
      allowed = false
      break
    end
  end
  if quotas and allowed then
    for j = 1, nq do
      local need = cost
      if costs then need = costs[n + j] end
      if need < 0 then need = -need end
      if need > quotas[j].a - quotas[j].u then
        allowed = false
        break
      end
    end
  end
  -- A check under another policy writes the bucket it converted, even when it is denied, so that
  -- from now on it refills at the new policy's rate (Step's write).
  write = write or take and converted
  take = take and allowed
  write = write or take
  local remaining, bound, retry, reset = -1, 1, 0, 0
  local value
  local version = 1
  -- The standing of each limit and quota, for a policy of more than one: remaining and reset,
  -- into the reply.
  local standing = n > 1 or quotas
  for i = 1, n do
    local l = limits[i]
    local need = cost
    if costs then need = costs[i] end
    if need < 0 then need = -need end
    if take then
      levels[i] = levels[i] - need * l.p
    end
    if levels[i] < 0 then version = 2 end
    local tok = floorDiv(levels[i], l.p)
    if tok < 0 then tok = 0 end
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
    if standing then reply[y + 3 + 2 * i], reply[y + 4 + 2 * i] = tok, w end
  end
  if quotas then for j = 1, nq do
    local q, need = quotas[j], cost
    if costs then need = costs[n + j] end
    if need < 0 then need = -need end
    if take then q.u = q.u + need end
    local tok = q.a - q.u
    if tok < 0 then tok = 0 end
    if remaining < 0 or tok < remaining then
      remaining = tok
      if allowed then bound = n + j end
    end
    local w = q.we - t0
    if not allowed and need > q.a - q.u and w > retry then
      retry, bound = w, n + j
    end
    if q.u > 0 and w > reset then reset = w end
    reply[y + 3 + 2 * (n + j)], reply[y + 4 + 2 * (n + j)] = tok, w
  end end
  if write then
    -- (One limit, the usual policy, in one pack: 2,600 instructions fewer than the loop's two
    -- packs and a concatenation, the same bytes.)
    local l = limits[1]
    if quotas and n == 1 and nq == 1 then
      local q = quotas[1]
      value = struct.pack('>BI7BBi7I7I7I7i7i7I7', 3, t0, 1, 1, levels[1], l.c, l.r, l.p, q.ws, q.we, q.u)
    elseif quotas then
      value = struct.pack('>BI7BB', 3, t0, n, nq)
      for i = 1, n do
        l = limits[i]
        value = value .. struct.pack('>i7I7I7I7', levels[i], l.c, l.r, l.p)
      end
      for j = 1, nq do
        local q = quotas[j]
        value = value .. struct.pack('>i7i7I7', q.ws, q.we, q.u)
      end
    elseif n == 1 then
      value = struct.pack('>BI7i7I7I7I7', version, t0, levels[1], l.c, l.r, l.p)
    else
      value = struct.pack('>BI7', version, t0)
      for i = 1, n do
        l = limits[i]
        value = value .. struct.pack('>i7I7I7I7', levels[i], l.c, l.r, l.p)
      end
    end
    -- The key lives until the bucket is full: (reset + back) / 1 ms, rounded up once; a bucket
    -- full already (a settle's refund) for the 1 ms minimum.
    local wait = back
    if reset == 0 then wait = 0 end
    redis.call('SET', key, value, 'PX', px(reset, wait))
  end
  local flags = 16 * (bound - 1)
  if allowed then flags = flags + 1 end
  if converted then flags = flags + 2 end
  return flags, remaining, reset, retry, back
end

-- step1 is step for the usual check: a policy of one limit l, and at most one quota q, one cost
-- (negative: ask, take nothing), no record, on a bucket that is missing or that the policy wrote
-- (36 bytes; 59 with q's band). It returns what step returns, and with q writes the standings of
-- l and q into reply from reply[y + 5]; or false, having read the bucket and changed nothing,
-- when step must decide (a bucket another policy wrote, one it would refuse as malformed, or a
-- clock a window away, which step says why; or bytes of c, r and p other than the policy's, which
-- step reads as numbers). The same decision as step's, in a fraction of its instructions: no
-- table, no loop.
local function step1(key, l, q, cost, now, take, reply, y)
  local need, c, p, r, full = cost, l.c, l.p, l.r, l.full
  if need < 0 then need = -need end
  if need > c then return nil, MALFORMED end -- (with q, a cost of 1, within any allowance)
  local raw = rpcall('GET', key)
  local t0, back, level = now, 0, full
  local bs, be, bu -- q's stored band: its window and what it used there
  if raw then
    if typeof(raw) ~= 'string' then return false end
    local len, v, last, lv, crp, m, sq = #raw
    if len == 36 then
      v, last, lv, crp = sunpack('>BI7i7c21', raw)
      if (v ~= 1 or lv < 0) and (v ~= 2 or lv >= 0) then return false end
    elseif q and len == 59 then
      v, last, m, sq, lv, crp, bs, be, bu = sunpack('>BI7BBi7c21i7i7I7', raw)
      if v ~= 3 or m ~= 1 or sq ~= 1 or bs >= be or bs < -MAX or be > MAX or bu > MAX then return false end
    else
      return false
    end
    if crp ~= l.crp or last > MAXTIME or lv > full or lv < l.floor then return false end
    if last > now then t0, back = last, last - now end
    local missing = full - lv
    if missing > 0 and t0 - last < ceilDiv(missing, r) then
      level = lv + (t0 - last) * r
    elseif not (bu and bu > 0 and bs <= t0 and t0 < be) then
      -- Full by now, and no quota used in the window of now: the same as a missing bucket,
      -- decided at now.
      t0, back = now, 0
    end
  end
  local ws, we, u = 0, 0, 0 -- q's window that holds t0, and what it used there
  if q then
    ws, we = window(q, t0)
    if not ws then return false end
    if bs == ws and be == we then u = bu end
  end
  local flags, retry, write, bound = 0, 0, false, 1
  if level >= need * p and (not q or need <= q.a - u) then
    flags, write = 1, take and cost > 0
    if write then
      level, u = level - need * p, u + need -- (the level at least 0: it writes version 1 or 3)
    end
  else
    if level < need * p then retry = ceilDiv(need * p - level, r) end
    if q and need > q.a - u and we - t0 > retry then retry, bound = we - t0, 2 end
  end
  local remaining, reset = floorDiv(level, p), ceilDiv(full - level, r)
  if remaining < 0 then remaining = 0 end
  if q then
    local left = q.a - u
    if left < 0 then left = 0 end
    reply[y + 5], reply[y + 6], reply[y + 7], reply[y + 8] = remaining, reset, left, we - t0
    if left < remaining then
      remaining = left
      if flags == 1 then bound = 2 end
    end
    if u > 0 and we - t0 > reset then reset = we - t0 end
  end
  if write then
    local value
    if q then
      value = spack('>BI7BBi7c0i7i7I7', 3, t0, 1, 1, level, l.crp, ws, we, u)
    else
      value = spack('>BI7i7c0', 1, t0, level, l.crp)
    end
    rcall('SET', key, value, 'PX', px(reset, back))
  end
  return flags + 16 * (bound - 1), remaining, reset, retry, back
end

-- memo: each policy string decoded, to its limits (false when malformed), kept from call to call
-- in a library (at most 64: then it starts again), for one call in a script. Nothing changes a
-- decoded limit.
local memo, memos = {}, 0

-- decode returns the limits of the policy string pol (see the header), each limit's c, r and p
-- checked by Limit.Validate's rules (which Go has already checked), and its full level and debt
-- floor (c·p and -Debt·p) and its 21 bytes of c, r and p in the policy (crp) for step1: the bytes
-- a bucket stores after its level, so that step1 compares and writes them as one string; or
-- false when it is malformed.
local function decode(pol)
  local len = #pol
  local n = len >= 22 and struct.unpack('>B', pol)
  if not n or n < 1 or n > 8 or len < 1 + 21 * n then return false end
  local limits = {}
  for i = 1, n do
    local c, r, p = struct.unpack('>I7I7I7', pol, 2 + 21 * (i - 1))
    if c < 1 or r < 1 or p < 1 or c > MAX or r > MAX or p > MAX or c > MAX / p then
      return false
    end
    limits[i] = {c = c, r = r, p = p, full = c * p, floor = -math.min(c, floorDiv(MAX - c * p, p)) * p,
      crp = string.sub(pol, 2 + 21 * (i - 1), 22 + 21 * (i - 1))}
  end
  limits.parts = n -- limits and quotas
  if len ~= 1 + 21 * n then
    -- Quotas: each its allowance and the windows around the caller's clock.
    local nq = struct.unpack('>B', pol, 2 + 21 * n)
    if nq < 1 or n + nq > 8 or len ~= 2 + 21 * n + 35 * nq then return false end
    local quotas = {}
    for j = 1, nq do
      local a, ps, s, e, ne = struct.unpack('>I7i7i7i7i7', pol, 3 + 21 * n + 35 * (j - 1))
      if a < 1 or a > MAX or ps < -MAX or ne > MAX or ps >= s or s >= e or e >= ne then return false end
      quotas[j] = {a = a, ps = ps, s = s, e = e, ne = ne}
    end
    limits.quotas, limits.parts = quotas, n + nq
    if n == 1 and nq == 1 then limits.q = quotas[1] end -- (step1's)
  end
  return limits
end

-- policy returns the limits of the policy string pol, from the memo, decoding it (and memoizing
-- it) when it is not there; false when it is malformed.
local function policy(pol)
  local limits = memo[pol]
  if limits == nil then
    limits = decode(pol)
    if memos == 64 then memo, memos = {}, 0 end
    memo[pol], memos = limits, memos + 1
  end
  return limits
end

-- zeros: 21·16 zeros, which newReply unpacks into a reply of standings of several keys (a table
-- constructor of a multiple return is made at its full size, where one that grows is copied at
-- each power of two); made when first needed, since a script would make it on every call.
local zeros

-- newReply returns the table of the reply of k keys and its size: 5, then 5 zeros per key, made at
-- its full size for up to 16 keys (a table that grows is copied at each power of two: at 4 keys,
-- 1,200 instructions per decision). Past its 1 + 5k integers it may hold more zeros, and main sets
-- the first of those to nil: Redis ends a reply's array at its first nil.
local function newReply(k, w)
  if w == 9 and k == 1 then
    return {9, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 10
  elseif w > 5 and k == 1 then
    return {w,
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
    }, 22
  elseif w > 5 then
    -- Standings: 5 + 2P integers a key, made at their full size in one step.
    if not zeros then
      zeros = {}
      for i = 1, 21 * 16 do zeros[i] = 0 end
    end
    if w * k <= 21 * 16 then
      return {w, unpack(zeros, 1, w * k)}, 1 + w * k
    end
    local reply = {w}
    for i = 2, 1 + w * k do reply[i] = 0 end
    return reply, 1 + w * k
  end
  if k == 1 then
    return {5, 0, 0, 0, 0, 0}, 6
  elseif k <= 4 then
    return {5,
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
    }, 21
  elseif k <= 8 then
    return {5,
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
    }, 41
  end
  return {5,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
  }, 81
end

-- kept6, kept21, kept41, kept81: the reply tables of one key and of up to 4, 8 and 16, for policies
-- of one limit (W = 5), each made once and handed out again (by main for one key, else keptReply):
-- Redis has read a reply before the next call begins, and main writes each key's 5 integers (after
-- the key's last pass) and ends the array with a nil, so nothing of an earlier call is read (a
-- reply table made and collected costs some 1,000 instructions). Each is made when first needed, as
-- scratch is.
local kept6, kept21, kept41, kept81

-- keptReply returns the kept reply table of k keys, 2 <= k <= 16, and its size.
local function keptReply(k)
  if k <= 4 then
    if not kept21 then kept21 = newReply(k, 5) end
    return kept21, 21
  elseif k <= 8 then
    if not kept41 then kept41 = newReply(k, 5) end
    return kept41, 41
  end
  if not kept81 then kept81 = newReply(k, 5) end
  return kept81, 81
end

-- formats: struct.pack's format of a packed reply of n integers, by n (see packed); made when
-- first needed, as scratch is.
local formats

-- packed returns the first n integers of reply, W and then the keys' entries, packed in a string
-- (see the header): Redis turns a table into its reply by reading some ten fields of it and then
-- each slot, 5,700 instructions for one key, where a string is copied.
local function packed(reply, n)
  if n == 6 then
    return spack('>BI7I7I7I7I7', reply[1], reply[2], reply[3], reply[4], reply[5], reply[6])
  end
  if not formats then formats = {} end
  local f = formats[n]
  if not f then
    f = '>B' .. string.rep('I7', n - 1)
    formats[n] = f
  end
  return spack(f, spread(reply, 1, n))
end

-- usual returns the limits and the cost of a key of the usual kind, its cost "1" (a check) or
-- "-1" (a peek) and its policy one limit and at most one quota; for a key of any other kind, nil.
local function usual(arg, pol)
  local limits = memo[pol]
  if limits == nil then limits = policy(pol) end
  if not limits or limits.parts ~= 1 and not limits.q then return nil end
  if arg == '1' then return limits, 1 end
  if arg == '-1' then return limits, -1 end
  return nil
end

-- kept10: the reply table of a call of one key of a limit and a quota (W = 9), kept as kept6 is;
-- kept9[k], of k such keys (each made when first needed, as scratch is).
local kept10, kept9

-- plain decides a call in mode "each" whose every key is of the usual kind (see usual), each
-- policy one limit (W = 5) or each a limit and a quota (W = 9), and returns its reply; for any
-- other call it returns nil, having changed nothing, and general decides it. (Each
-- key goes to step1 without the general path's work for costs, groups, records and standings:
-- 4,800 instructions fewer a call of one key, 800 a key of sixteen.)
local function plain(KEYS, ARGV, nkeys, now)
  local w, limits, cost = 5, nil, nil -- W: from the policy for one key, given after several
  local nargs = #ARGV
  if nkeys == 1 then
    if nargs ~= 4 then return nil end
    limits, cost = usual(ARGV[3], ARGV[4])
    if not limits then return nil end
    if not limits.q then
      -- One key of one limit: its reply packed from the integers.
      local key = KEYS[1]
      local flags, remaining, reset, retry, back = step1(key, limits[1], nil, cost, now, true)
      if flags == false then
        flags, remaining, reset, retry, back = step(key, limits, cost, nil, now, true, nil, nil, 2)
      end
      if not flags then return {5, {err = remaining}, 0, 0, 0, 0} end
      return spack('>BI7I7I7I7I7', 5, flags, remaining, reset, retry, back)
    end
    w = 9
  else
    if nargs == 3 + 2 * nkeys then
      if ARGV[3 + 2 * nkeys] ~= '9' then return nil end
      w = 9
    elseif nargs ~= 2 + 2 * nkeys or nkeys == 0 then
      return nil
    end
    for j = 1, nkeys do
      local l = usual(ARGV[1 + 2 * j], ARGV[2 + 2 * j])
      if not l or (w == 9) ~= (l.q ~= nil) then return nil end
    end
  end
  local reply, size, failed = nil, 1 + w * nkeys, false
  if w == 9 and nkeys == 1 then
    if not kept10 then kept10 = newReply(1, 9) end
    reply = kept10
  elseif w == 9 then
    -- (Every slot of every key is written below: the table is kept as keptReply's are.)
    if not kept9 then kept9 = {} end
    reply = kept9[nkeys]
    if not reply then
      reply = newReply(nkeys, 9)
      kept9[nkeys] = reply
    end
  elseif nkeys > 16 then
    reply, size = newReply(nkeys, 5)
  elseif nkeys > 1 then
    reply, size = keptReply(nkeys)
  end
  for j = 1, nkeys do
    if nkeys > 1 then
      limits, cost = memo[ARGV[2 + 2 * j]], 1 -- (usual found each in the memo)
      if ARGV[1 + 2 * j] ~= '1' then cost = -1 end
    end
    local y = 2 + w * (j - 1)
    local flags, remaining, reset, retry, back = step1(KEYS[j], limits[1], limits.q, cost, now, true, reply, y)
    if flags == false then
      flags, remaining, reset, retry, back = step(KEYS[j], limits, cost, nil, now, true, nil, reply, y)
    end
    if flags then
      reply[y], reply[y + 1], reply[y + 2], reply[y + 3], reply[y + 4] = flags, remaining, reset, retry, back
    else
      reply[y], reply[y + 1], reply[y + 2], reply[y + 3], reply[y + 4] = {err = remaining}, 0, 0, 0, 0
      for i = y + 5, y + w - 1 do reply[i] = 0 end
      failed = true
    end
  end
  if not failed then return packed(reply, 1 + w * nkeys) end
  if size > 1 + w * nkeys then reply[2 + w * nkeys] = nil end -- (the end of the array: see newReply)
  return reply
end

-- general decides a call of any kind at now (µs), and returns its reply.
local function general(KEYS, ARGV, now)
  local mode = ARGV[2]
  local nkeys, groups = #KEYS, nil
  local reserve, settle, refund = mode == 'reserve', mode == 'settle', mode == 'refund'
  local keep -- reserve: the record's lifetime in ms
  if refund then
    if nkeys ~= 1 or #ARGV ~= 4 then return redis.error_reply(MALFORMED) end
  elseif reserve or settle then
    local want = 4
    if reserve or nkeys == 1 then want = 5 end
    if (nkeys ~= 2 and not (settle and nkeys == 1)) or #ARGV ~= want then return redis.error_reply(MALFORMED) end
    nkeys = 1
    if reserve then
      keep = tonumber(ARGV[5])
      if keep == nil or keep < 1 or keep % 1 ~= 0 or keep > MAX then return redis.error_reply(MALFORMED) end
    end
  elseif #ARGV ~= 2 + 2 * nkeys and not (nkeys > 1 and #ARGV == 3 + 2 * nkeys) then
    return redis.error_reply(MALFORMED)
  elseif mode == 'all' then
    groups = {nkeys}
  elseif mode ~= 'each' then
    -- Group sizes, each at least 1, adding up to K.
    groups = {}
    local sum = 0
    for g in string.gmatch(mode .. ',', '([^,]*),') do
      if not string.find(g, '^[1-9]%d*$') then return redis.error_reply(MALFORMED) end
      local size = tonumber(g)
      groups[#groups + 1], sum = size, sum + size
    end
    if sum ~= nkeys then return redis.error_reply(MALFORMED) end
  end

  -- W, the integers a key (see the header): a call of several keys gives it after them when it
  -- is not 5; a call of one key takes it from its policy.
  local w = 5
  if nkeys > 1 and #ARGV == 3 + 2 * nkeys then
    w = tonumber(ARGV[3 + 2 * nkeys])
    if w == nil or w % 2 ~= 1 or w < 7 or w > 21 then return redis.error_reply(MALFORMED) end
  end

  -- A settle's record: its limits and what each took (nil when there is none, or when it is of
  -- another bucket), checked as a bucket's fields are, and its bucket.
  local held
  local keys, record = KEYS, KEYS[2]
  if settle then
    if #KEYS == 1 then record = KEYS[1] end
    local raw = redis.call('GET', record)
    if raw then
      local len = #raw
      local v, m, nq, first = 0, 0, 0, 3
      if len >= 31 then v, m = struct.unpack('>BB', raw) end
      if v == 3 then
        nq, first = struct.unpack('>B', raw, 3), 4
        if nq < 1 or m + nq > 8 then v = 0 end
      end
      if v ~= 2 and v ~= 3 or m < 1 or m > 8 or len <= first - 1 + 28 * m + 21 * nq then
        return redis.error_reply('ratelimit: malformed bucket state: reservation record')
      end
      held = {}
      for k = 1, m do
        local tokens, c, r, p = struct.unpack('>I7I7I7I7', raw, first + 28 * (k - 1))
        if c < 1 or r < 1 or p < 1 or c > MAX or r > MAX or p > MAX or c > MAX / p or tokens > c then
          return redis.error_reply('ratelimit: malformed bucket state: reservation record')
        end
        held[k] = {tokens = tokens, c = c, r = r, p = p}
      end
      for k = 1, nq do
        local tokens, s, e = struct.unpack('>I7i7i7', raw, first + 28 * m + 21 * (k - 1))
        if tokens > MAX or s >= e or s < -MAX or e > MAX then
          return redis.error_reply('ratelimit: malformed bucket state: reservation record')
        end
        held[m + k] = {q = true, tokens = tokens, s = s, e = e}
      end
      local bucket = string.sub(raw, first + 28 * m + 21 * nq)
      if #KEYS == 1 then
        local prefix = ARGV[5]
        if string.sub(bucket, 1, #prefix) == prefix then
          keys = {bucket}
        else
          held = nil -- another namespace's: not found there
        end
      elseif bucket ~= KEYS[1] then
        held = nil -- another bucket's
      end
    end
    if #KEYS == 1 and not held then
      local limits = policy(ARGV[4])
      if limits and limits.parts > 1 then w = 5 + 2 * limits.parts end
      local reply, size = newReply(1, w)
      reply[2] = 8
      if size > 1 + w then reply[2 + w] = nil end
      return reply
    end
  end

  -- Each group is StepAll: a first pass decides its keys without taking, and only when every one
  -- is allowed a second pass decides them again, taking their costs. "each" decides every key in
  -- one pass, on its own, and so does a group of one.
  local reply, size
  if nkeys > 1 and w == 5 and nkeys <= 16 then
    reply, size = keptReply(nkeys)
  elseif nkeys > 1 then
    reply, size = newReply(nkeys, w)
  end
  local first, g, failed = 1, 0, false
  while first <= nkeys do
    -- "each" is one run of every key, one pass; a group, its keys.
    local last, passes, all = nkeys, 1, true
    if groups then
      g = g + 1
      last = first + groups[g] - 1
      if groups[g] > 1 then passes = 2 end
    end
    for pass = 1, passes do
      if not all then break end
      for j = first, last do
        -- Key j's cost and limits, and a list of costs read when it is one.
        local arg, pol = ARGV[1 + 2 * j], ARGV[2 + 2 * j]
        local limits = memo[pol]
        if limits == nil then limits = policy(pol) end
        local cost, costs = 1, nil
        if arg ~= '1' then cost = tonumber(arg) end -- (the usual cost compared, not converted: 1,450 instructions fewer)
        local parts = limits and limits.parts or 0
        if reply and parts > 1 and 5 + 2 * parts > w then limits = false end -- (no room for its standings)
        if cost == nil and limits then
          -- One cost per limit and quota: each at least 1, or each at most -1 to ask for them
          -- and take none (for a settle, each used count at least 0).
          costs, cost = {}, 1
          for c in string.gmatch(arg, '[^,]+') do
            costs[#costs + 1] = tonumber(c) or 0
          end
          if #costs ~= parts then costs = false end
          if costs and costs[1] < 0 and not settle then cost = -1 end
          for i = 1, parts do
            local c = costs and costs[i]
            if not c or c ~= c or c % 1 ~= 0 or c > MAX or c < -MAX or c * cost < 1 and not (settle and c == 0) then
              costs = false
            end
          end
        elseif cost ~= nil and (cost ~= cost or cost % 1 ~= 0 or cost == 0 and not settle or cost < 0 and settle or cost > MAX) then
          cost = nil
        end
        if not reply then
          -- One key: its reply, W from its policy.
          if parts > 1 then
            w = 5 + 2 * parts
            reply, size = newReply(1, w)
          else
            if not kept6 then kept6 = {5, 0, 0, 0, 0, 0} end
            reply, size = kept6, 6
          end
        end
        local y = 2 + w * (j - 1)
        local flags, remaining, reset, retry, back
        if refund and cost and cost < 1 then cost = nil end -- (no asking)
        if refund and cost and costs ~= false and limits then
          -- A refund is the settle of a reservation of its costs that used nothing.
          held = {}
          for i = 1, parts do
            local c = cost
            if costs then c = costs[i] end
            if i <= #limits then
              local l = limits[i]
              held[i] = {tokens = c, c = l.c, r = l.r, p = l.p}
            else
              held[i] = {q = true, cur = true, tokens = c} -- (the current window's)
            end
          end
          cost, costs = 0, nil
        end
        if cost and costs ~= false and limits then
          if settle and not held then
            -- No record: the standing, as a peek reports it, and flag 8.
            flags, remaining, reset, retry, back = step(keys[j], limits, -1, nil, now, false, nil, reply, y)
            if flags then flags = flags + 8 end
          else
            if parts == 1 and not costs and not held then
              flags, remaining, reset, retry, back = step1(keys[j], limits[1], nil, cost, now, pass == passes)
            end
            if not flags and remaining == nil then
              flags, remaining, reset, retry, back = step(keys[j], limits, cost, costs, now, pass == passes, held, reply, y)
            end
          end
        else
          remaining = MALFORMED
        end
        if flags and reserve and flags % 2 == 1 then
          -- Reserved: the record of what each limit and quota took (a quota, in its window), and
          -- of the bucket, kept for ARGV[5] ms.
          local value
          if parts > #limits then
            value = struct.pack('>BBB', 3, #limits, parts - #limits)
          else
            value = struct.pack('>BB', 2, #limits)
          end
          for i = 1, parts do
            local c = cost
            if costs then c = costs[i] end
            if i <= #limits then
              local l = limits[i]
              value = value .. struct.pack('>I7I7I7I7', c, l.c, l.r, l.p)
            else
              local q = i - #limits
              local qt = limits.quotas[q]
              value = value .. struct.pack('>I7i7i7', c, qt.ws, qt.we)
            end
          end
          redis.call('SET', KEYS[2], value .. KEYS[1], 'PX', keep)
        end
        if flags then
          reply[y], reply[y + 1], reply[y + 2], reply[y + 3], reply[y + 4] = flags, remaining, reset, retry, back
          all = all and flags % 2 == 1
        else
          reply[y], reply[y + 1], reply[y + 2], reply[y + 3], reply[y + 4] = {err = remaining}, 0, 0, 0, 0
          all, failed = false, true
        end
      end
    end
    first = last + 1
  end

  if settle and held and type(reply[2]) == 'number' then
    redis.call('DEL', record)
  end
  if not failed then return packed(reply, 1 + w * nkeys) end
  if size > 1 + w * nkeys then
    reply[2 + w * nkeys] = nil -- (the end of the array: see newReply)
  end
  return reply
end

-- main is one call: the keys and arguments of the header, and its reply. It reads the clock, and
-- a call of the usual kind goes to plain, any other to general.
local function main(KEYS, ARGV)
  if not rcall then
    rcall, rpcall, spack, sunpack = redis.call, redis.pcall, struct.pack, struct.unpack
    sformat, spread, typeof = string.format, unpack, type
  end
  local now = ARGV[1]
  if now == '' then
    local t = rcall('TIME')
    now = t[1] * 1000000 + t[2]
  else
    now = now and tonumber(now)
    if not now or now ~= now or now < 0 or now > MAXTIME or now % 1 ~= 0 then
      return redis.error_reply(MALFORMED)
    end
  end
  if ARGV[2] == 'each' then
    local reply = plain(KEYS, ARGV, #KEYS, now)
    if reply then return reply end
  end
  return general(KEYS, ARGV, now)
end

if redis.register_function then
  redis.register_function(NAME, main)
else
  return main(KEYS, ARGV)
end
