package redistest

import "github.com/exactlimit/ratelimit/internal/keyfmt"

// NumSlots is the number of hash slots of a Redis Cluster.
const NumSlots = keyfmt.NumSlots

// SlotOf returns the Redis Cluster hash slot of key, as CLUSTER KEYSLOT does:
// CRC16 (XMODEM) modulo 16384 of the key, or of its hash tag when the key
// contains a "{" followed later by a "}" with at least one byte between the
// first such pair.
func SlotOf(key string) int { return int(keyfmt.Slot(key)) }
