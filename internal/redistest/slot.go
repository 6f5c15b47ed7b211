package redistest

import "strings"

// NumSlots is the number of hash slots of a Redis Cluster.
const NumSlots = 16384

// crc16tab is the CRC16-CCITT (XMODEM) table: polynomial 0x1021, initial
// value 0, no reflection, as used by Redis Cluster.
var crc16tab = func() (tab [256]uint16) {
	for i := range tab {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		tab[i] = crc
	}
	return tab
}()

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16tab[byte(crc>>8)^s[i]]
	}
	return crc
}

// SlotOf returns the Redis Cluster hash slot of key, as CLUSTER KEYSLOT does:
// CRC16 (XMODEM) modulo 16384 of the key, or of its hash tag when the key
// contains a "{" followed later by a "}" with at least one byte between the
// first such pair.
func SlotOf(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key)) % NumSlots
}
