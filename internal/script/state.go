package script

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// EncodeState returns st in the script's stored format (see the header of
// tokenbucket.lua): its Last, then per band its level and its limit, as
// they are. The script reads a level in units of 1/P of a token, P the
// stored period, and writes limits in lowest terms, as Step counts levels:
// give EncodeState limits in lowest terms (Limit.Lowest), as the script
// stores them, for the script to read the bucket as Step would. It is the
// format of a key's value, for tools that read or seed buckets.
func EncodeState(st tokenbucket.State) string {
	b := appendUint56(make([]byte, 0, 7+len(st.Bands)*14), st.Last)
	for _, band := range st.Bands {
		l := band.Limit
		b = appendUint56(b, band.Level)
		b = binary.AppendUvarint(b, uint64(l.Capacity))
		b = binary.AppendUvarint(b, uint64(l.RefillTokens))
		b = binary.AppendUvarint(b, uint64(l.RefillPeriod.Microseconds()))
	}
	return string(b)
}

// DecodeState reads a bucket in the script's stored format. A value the
// script would refuse as malformed is an error wrapping
// tokenbucket.ErrCorruptState, and so is any value EncodeState would not
// write (a varint in more bytes than it needs): a decoded state re-encodes
// to the same bytes, and never holds more than its capacity.
func DecodeState(raw string) (tokenbucket.State, error) {
	var st tokenbucket.State
	if len(raw) < 17 {
		return st, corrupt("too short")
	}
	st.Last = uint56(raw)
	if st.Last > tokenbucket.MaxTime {
		return st, corrupt("time out of range")
	}
	for pos := 7; pos < len(raw); {
		if len(st.Bands) == tokenbucket.MaxLimits || pos+9 >= len(raw) {
			return tokenbucket.State{}, corrupt("wrong number of fields")
		}
		level := uint56(raw[pos:])
		pos += 7
		var v [3]uint64
		for f := range v {
			x, n := binary.Uvarint([]byte(raw[pos:min(len(raw), pos+8)]))
			if n <= 0 || n > 1 && raw[pos+n-1] == 0 {
				return tokenbucket.State{}, corrupt("truncated limit")
			}
			v[f], pos = x, pos+n
		}
		c, r, p := v[0], v[1], v[2]
		if c < 1 || r < 1 || p < 1 || c > tokenbucket.MaxExact || r > tokenbucket.MaxExact || p > tokenbucket.MaxExact ||
			c > tokenbucket.MaxExact/p || uint64(level) > c*p {
			return tokenbucket.State{}, corrupt("field out of range")
		}
		l := ratelimit.Limit{Capacity: int64(c), RefillTokens: int64(r), RefillPeriod: time.Duration(p) * time.Microsecond}
		st.Bands = append(st.Bands, tokenbucket.Band{Limit: l, Level: level})
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

func uint56(s string) int64 {
	var v int64
	for i := range 7 {
		v = v<<8 | int64(s[i])
	}
	return v
}
