package main

import (
	"fmt"
	"strings"

	"github.com/exactlimit/ratelimit/redisstore"
)

// A script variant is a modified copy of redisstore's tokenbucket.lua that
// stores the same state (the time, every band's exact level and the policy
// that wrote it) in a more compact value. Each is derived at run time from
// the shipped script by replacing two blocks, the read of the stored value
// and its write, so the arithmetic between them stays the shipped one; the
// ARGV layout and the reply are unchanged. The differential check in
// memory.go holds each variant's replies equal to the shipped script's.
type variant struct {
	name, value string // value describes the stored value
	read, write string // Lua replacing the shipped blocks
	// transform, when set, derives the variant from the whole shipped
	// script instead.
	transform func(string) (string, error)
}

// The anchors of the two blocks in tokenbucket.lua.
const (
	readFrom  = "local ok, raw = pcall(redis.call, 'GET', key)"
	readTo    = "local t0, back = now, 0"
	writeFrom = "if exists or not peek then"
	writeTo   = "local a = 0"
)

// b36 encodes and the policy parsers shared by the variants.
const luaB36 = `
local B36 = '0123456789abcdefghijklmnopqrstuvwxyz'
local function b36(x)
  if x == 0 then
    return '0'
  end
  local s = ''
  while x > 0 do
    local d = x % 36
    s = string.sub(B36, d + 1, d + 1) .. s
    x = (x - d) / 36
  end
  return s
end
`

// policyCheck validates a stored band's limit with the shipped rules.
const luaPolicyCheck = `
local function badlimit(c, r, p)
  return c == nil or r == nil or p == nil or c ~= math.floor(c) or r ~= math.floor(r) or p ~= math.floor(p)
    or c < 1 or r < 1 or p < 1 or c * p > MAX or r > MAX
end
`

// binaryRead reads "<m: one byte><last: double><m levels: doubles><policy>",
// where policy is enc(c) SEP enc(r) SEP enc(p) per band, bands joined by ','.
// When the policy is the request's own (the common case) it is not parsed.
func binaryRead(enc, dec, sep string) string {
	return fmt.Sprintf(`
local function encpolicy(c, r, p)
  local g = {}
  for i = 1, #c do
    g[i] = %[1]s(c[i]) .. '%[3]s' .. %[1]s(r[i]) .. '%[3]s' .. %[1]s(p[i])
  end
  return table.concat(g, ',')
end
local POLICY = encpolicy(lc, lr, lp)
local ok, raw = pcall(redis.call, 'GET', key)
if not ok then
  corrupt('not a string')
end
local exists = false
local last = 0
local sl, sc, sr, sp = {}, {}, {}, {}
if raw then
  local m = string.byte(raw, 1)
  if m == nil or m < 1 or m > 8 or #raw < 1 + 8 * (m + 1) then
    corrupt('wrong number of fields')
  end
  last = struct.unpack('<d', raw, 2)
  if last ~= math.floor(last) or last < 0 or last > MAX then
    corrupt('time out of range')
  end
  local pol = string.sub(raw, 2 + 8 * (m + 1))
  if pol == POLICY and m == n then
    for j = 1, m do
      sc[j], sr[j], sp[j] = lc[j], lr[j], lp[j]
    end
  else
    local j = 0
    for g in string.gmatch(pol, '[^,]+') do
      j = j + 1
      local v = {}
      for w in string.gmatch(g, '[^%[3]s]+') do
        v[#v + 1] = %[2]s(w)
      end
      if #v ~= 3 or j > m then
        corrupt('wrong number of fields')
      end
      if badlimit(v[1], v[2], v[3]) then
        corrupt('field out of range')
      end
      sc[j], sr[j], sp[j] = v[1], v[2], v[3]
    end
    if j ~= m then
      corrupt('wrong number of fields')
    end
  end
  for j = 1, m do
    local l = struct.unpack('<d', raw, 2 + 8 * j)
    if l ~= math.floor(l) or l < 0 or l > sc[j] * sp[j] then
      corrupt('field out of range')
    end
    sl[j] = l
  end
  exists = true
end

`, enc, dec, sep)
}

const binaryWrite = `if exists or not peek then
  local parts = {string.char(n), struct.pack('<d', t0)}
  for i = 1, n do
    parts[#parts + 1] = struct.pack('<d', levels[i])
  end
  parts[#parts + 1] = POLICY
  redis.call('SET', key, table.concat(parts), 'PX', string.format('%.0f', ttl))
end

`

// text36Read reads "last L1 c1.r1.p1 [L2 c2.r2.p2 ...]", every number in
// base 36.
const text36Read = `
local ok, raw = pcall(redis.call, 'GET', key)
if not ok then
  corrupt('not a string')
end
local exists = false
local last = 0
local sl, sc, sr, sp = {}, {}, {}, {}
if raw then
  local f = {}
  for w in string.gmatch(raw, '%S+') do
    f[#f + 1] = w
  end
  local m = (#f - 1) / 2
  if m < 1 or m > 8 or m ~= math.floor(m) then
    corrupt('wrong number of fields')
  end
  last = tonumber(f[1], 36)
  if last == nil or last > MAX then
    corrupt('time out of range')
  end
  for j = 1, m do
    local v = {}
    for w in string.gmatch(f[2 * j + 1], '[^.]+') do
      v[#v + 1] = tonumber(w, 36)
    end
    if #v ~= 3 then
      corrupt('wrong number of fields')
    end
    local l = tonumber(f[2 * j], 36)
    if l == nil or badlimit(v[1], v[2], v[3]) or l > v[1] * v[3] then
      corrupt('field out of range')
    end
    sl[j], sc[j], sr[j], sp[j] = l, v[1], v[2], v[3]
  end
  exists = true
end

`

const text36Write = `if exists or not peek then
  local parts = {b36(t0)}
  for i = 1, n do
    parts[#parts + 1] = b36(levels[i]) .. ' ' .. b36(lc[i]) .. '.' .. b36(lr[i]) .. '.' .. b36(lp[i])
  end
  redis.call('SET', key, table.concat(parts, ' '), 'PX', string.format('%.0f', ttl))
end

`

// decimalRead and decimalWrite are the stored value before commit 513db88:
// "last L c r p [L2 c2 r2 p2 ...]" in decimal text.
const decimalRead = `local ok, raw = pcall(redis.call, 'GET', key)
if not ok then
  corrupt('not a string')
end
local exists = false
local last = 0
local sl, sc, sr, sp = {}, {}, {}, {}
if raw then
  local f = {}
  for w in string.gmatch(raw, '%S+') do
    f[#f + 1] = w
  end
  local m = (#f - 1) / 4
  if m < 1 or m > 8 or m ~= math.floor(m) then
    corrupt('wrong number of fields')
  end
  last = tonumber(f[1])
  if last == nil or last ~= math.floor(last) or last < 0 or last > MAX then
    corrupt('time out of range')
  end
  for j = 1, m do
    local l, c, r, p = tonumber(f[4 * j - 2]), tonumber(f[4 * j - 1]), tonumber(f[4 * j]), tonumber(f[4 * j + 1])
    if l == nil or l ~= math.floor(l) or badlimit(c, r, p) or l < 0 or l > c * p then
      corrupt('field out of range')
    end
    sl[j], sc[j], sr[j], sp[j] = l, c, r, p
  end
  exists = true
end

`

const decimalWrite = `if exists or not peek then
  local parts = {string.format('%.0f', t0)}
  for i = 1, n do
    parts[#parts + 1] = string.format('%.0f %.0f %.0f %.0f', levels[i], lc[i], lr[i], lp[i])
  end
  redis.call('SET', key, table.concat(parts, ' '), 'PX', string.format('%.0f', ttl))
end

`

func variants() []variant {
	return []variant{
		{name: "decimal text (before 513db88)",
			value: "\"last L c r p\" in decimal text, 44 bytes at 1000/s",
			read:  luaPolicyCheck + decimalRead, write: decimalWrite},
		{name: "binary, base-36 policy",
			value: "1 byte band count, time and level as 8-byte doubles, policy in base 36 (\"rs.rs.lfls\")",
			read:  luaPolicyCheck + luaB36 + binaryRead("b36", "(function(w) return tonumber(w, 36) end)", "."), write: binaryWrite},
		{name: "text, base 36",
			value: "\"last L c.r.p\" as text with every number in base 36",
			read:  luaPolicyCheck + luaB36 + text36Read, write: text36Write},
	}
}

// derive returns the shipped script with v's blocks in place.
func (v variant) derive() (string, error) {
	s := redisstore.Script
	if v.transform != nil {
		return v.transform(s)
	}
	// The variants change the stored value: the shipped script's fast path,
	// which reads and writes the shipped value, is cut out, and the blocks
	// are replaced in the general path.
	head, general, err := generalPath(s)
	if err != nil {
		return "", fmt.Errorf("variant %q: %w", v.name, err)
	}
	replace := func(s, from, to, with string) (string, error) {
		i := strings.Index(s, from)
		if i < 0 {
			return "", fmt.Errorf("variant %q: anchor %q not in tokenbucket.lua", v.name, from)
		}
		j := strings.Index(s[i:], to)
		if j < 0 {
			return "", fmt.Errorf("variant %q: anchor %q not in tokenbucket.lua", v.name, to)
		}
		return s[:i] + with + s[i+j:], nil
	}
	tail, err := replace(general, readFrom, readTo, v.read)
	if err != nil {
		return "", err
	}
	tail, err = replace(tail, writeFrom, writeTo, v.write)
	return head + tail, err
}

// generalPath splits the shipped script before its general path, with the
// call of its one-limit fast path cut out of the head: head+general decides
// every request on the general path.
func generalPath(s string) (head, general string, err error) {
	const marker = "-- The general path."
	const call = "if n == 1 then\n  local res = fastpath()\n  if res then\n    return res\n  end\nend\n"
	g := strings.Index(s, marker)
	if g < 0 || !strings.Contains(s[:g], call) {
		return "", "", fmt.Errorf("the fast path of tokenbucket.lua changed")
	}
	return strings.Replace(s[:g], call, "", 1), s[g:], nil
}
