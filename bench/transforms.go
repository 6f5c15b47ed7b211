package main

import (
	"fmt"
	"strings"
)

// The transforms below rewrite the shipped script for speed, keeping its
// stored value, ARGV and reply; the differential check holds them to it.

// leanEncode replaces uvarintenc's table and unpack with arithmetic for
// numbers below 2^21, and writes a one-limit bucket with one SET of one
// concatenation (no parts table, no string.format of the TTL).
func leanEncode(s string) (string, error) {
	from, to := "local function uvarintenc(n)", writeFrom
	i, j := strings.Index(s, from), strings.Index(s, to)
	if i < 0 || j < i {
		return "", fmt.Errorf("lean encode: anchors %q and %q not in tokenbucket.lua", from, to)
	}
	s = s[:i] + luaUvarintenc + s[j:]
	old := writeFrom + "\n  local parts = {"
	if !strings.Contains(s, old) {
		return "", fmt.Errorf("lean encode: the write block of tokenbucket.lua changed")
	}
	return strings.Replace(s, old, `if (exists or not peek) and n == 1 then
  redis.call('SET', key, struct.pack('>I7I7', t0, levels[1]) .. uvarintenc(lc[1]) .. uvarintenc(lr[1]) .. uvarintenc(lp[1]), 'PX', ttl)
elseif exists or not peek then
  local parts = {`, 1), nil
}

const luaUvarintenc = `local function uvarintenc(n)
  if n < 128 then
    return string.char(n)
  elseif n < 16384 then
    local q = math.floor(n / 128)
    return string.char(n - q * 128 + 128, q)
  elseif n < 2097152 then
    local q1 = math.floor(n / 128)
    local q2 = math.floor(q1 / 128)
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

`

// fastPath adds to leanEncode's script a path for the common case, one
// limit and a bucket that the same limit wrote (or none), that works on
// scalars instead of the general path's tables and loops; anything else
// (several limits, a policy change, a malformed value) takes the general
// path, which is the shipped code unchanged.
func fastPath(s string) (string, error) {
	s, err := leanEncode(s)
	if err != nil {
		return "", err
	}
	const stored = "-- The stored bucket."
	i := strings.Index(s, stored)
	u0, u1 := strings.Index(s, "local function uvarintenc(n)"), strings.Index(s, "if (exists or not peek) and n == 1 then")
	if i < 0 || u0 < i || u1 < u0 {
		return "", fmt.Errorf("fast path: anchors not in tokenbucket.lua")
	}
	head, rest := s[:i], s[i:]
	return head + s[u0:u1] + "local function general()\n" + rest + "\nend\n" + luaFastPath +
		"\nif n == 1 then\n  local res = fastpath()\n  if res then\n    return res\n  end\nend\nreturn general()\n", nil
}

const luaFastPath = `
local function fastpath()
  local C, R, P = lc[1], lr[1], lp[1]
  local full = C * P
  local penc = uvarintenc(C) .. uvarintenc(R) .. uvarintenc(P)
  local key = KEYS[1]
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
`
