package script

import (
	"errors"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/arith"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// The format versions of the stored value, its first byte (see the header of
// tokenbucket.lua): Version for a bucket whose every level is at least zero,
// the format of earlier releases too, and VersionDebt for one with a band in
// debt, whose negative level those releases cannot read.
// VersionQuotas is the format of a bucket whose policy has quotas: after
// the version and Last, the number of bands and of quota bands (a byte
// each), the bands, then per quota band its window's start and end (two's
// complement: a window may start before the epoch) and what it used, 7
// bytes each.
const (
	Version       = 1
	VersionDebt   = 2
	VersionQuotas = 3
)

// EncodeState returns st in the script's stored format (see the header of
// tokenbucket.lua): the version, its Last, then per band its level and its
// limit, as they are. The script reads a level in units of 1/P of a token, P
// the stored period, and writes limits in lowest terms, as Step counts
// levels: give EncodeState limits in lowest terms (tokenbucket.Lowest), as
// the script stores them, for the script to read the bucket as Step would. It
// is the format of a key's value, for tools that read or seed buckets.
func EncodeState(st tokenbucket.State) string {
	b := make([]byte, 1, 10+len(st.Bands)*28+len(st.Quotas)*21)
	b[0] = Version
	for _, band := range st.Bands {
		if band.Level < 0 {
			b[0] = VersionDebt
		}
	}
	if len(st.Quotas) > 0 {
		b[0] = VersionQuotas
	}
	b = appendUint56(b, st.Last)
	if len(st.Quotas) > 0 {
		b = append(b, byte(len(st.Bands)), byte(len(st.Quotas)))
	}
	for _, band := range st.Bands {
		b = appendUint56(b, band.Level)
		b = appendLimit(b, band.Limit)
	}
	for _, q := range st.Quotas {
		b = appendUint56(b, q.Start)
		b = appendUint56(b, q.End)
		b = appendUint56(b, q.Used)
	}
	return string(b)
}

// DecodeState reads a bucket in the script's stored format. A value the
// script would refuse as malformed is an error wrapping
// tokenbucket.ErrCorruptState (and so is a value of another version): a
// decoded state re-encodes to the same bytes, and never holds more than its
// capacity or owes more than its debt floor.
func DecodeState(raw string) (tokenbucket.State, error) {
	var st tokenbucket.State
	bands, quotas := 8, len(raw) // where the bands and the quota bands start
	switch {
	case len(raw) < 36:
		return st, corrupt("too short")
	case raw[0] == VersionQuotas:
		nb, nq := int(raw[8]), int(raw[9])
		if nb < 1 || nq < 1 || nb+nq > tokenbucket.MaxLimits || len(raw) != 10+28*nb+21*nq {
			return st, corrupt("wrong number of fields")
		}
		bands, quotas = 10, 10+28*nb
	case (len(raw)-8)%28 != 0 || len(raw) > 8+28*tokenbucket.MaxLimits:
		return st, corrupt("wrong number of fields")
	case raw[0] != Version && raw[0] != VersionDebt:
		return st, corrupt("unknown version")
	}
	st.Last = uint56(raw[1:])
	if st.Last > tokenbucket.MaxTime {
		return tokenbucket.State{}, corrupt("time out of range")
	}
	for pos := quotas; pos < len(raw); pos += 21 {
		q := tokenbucket.QuotaBand{Start: int56(raw[pos:]), End: int56(raw[pos+7:]), Used: uint56(raw[pos+14:])}
		if q.Start >= q.End || q.Start < -tokenbucket.MaxExact || q.End > tokenbucket.MaxExact || q.Used > tokenbucket.MaxExact {
			return tokenbucket.State{}, corrupt("field out of range")
		}
		st.Quotas = append(st.Quotas, q)
	}
	debt := false
	for pos := bands; pos < quotas; pos += 28 {
		level, c, r, p := int56(raw[pos:]), uint56(raw[pos+7:]), uint56(raw[pos+14:]), uint56(raw[pos+21:])
		if c < 1 || r < 1 || p < 1 || c > tokenbucket.MaxExact || r > tokenbucket.MaxExact || p > tokenbucket.MaxExact ||
			c > tokenbucket.MaxExact/p || level > c*p || level < -(arith.Rate{C: c, R: r, P: p}).Debt()*p {
			return tokenbucket.State{}, corrupt("field out of range")
		}
		debt = debt || level < 0
		l := ratelimit.Limit{Capacity: c, RefillTokens: r, RefillPeriod: time.Duration(p) * time.Microsecond}
		st.Bands = append(st.Bands, tokenbucket.Band{Limit: l, Level: level})
	}
	if raw[0] != VersionQuotas && debt != (raw[0] == VersionDebt) {
		// Each version has one encoding: a bucket in debt is version 2.
		return tokenbucket.State{}, corrupt("field out of range")
	}
	return st, nil
}

var errCorrupt = errors.New("malformed stored bucket")

func corrupt(what string) error {
	return fmt.Errorf("%w: %w: %s", tokenbucket.ErrCorruptState, errCorrupt, what)
}

func appendUint56(b []byte, v int64) []byte {
	return append(b, byte(v>>48), byte(v>>40), byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

// int56 reads a 7-byte two's-complement integer.
func int56(s string) int64 { return uint56(s) << 8 >> 8 }

func uint56(s string) int64 {
	var v int64
	for i := range 7 {
		v = v<<8 | int64(s[i])
	}
	return v
}
