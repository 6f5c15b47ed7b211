// Package keyfmt is the one definition of a bucket's store key: its frame
// "<len(namespace)>:<namespace>:<subject>", how to take one apart, how to
// name one in a log without its subject, how a key function joins parts,
// the Redis Cluster hash slot a key lives in, a reservation's id and
// record key, and the keys of a namespace's assignments.
//
// The length frame keeps namespace "a" with subject "b:c" apart from
// namespace "a:b" with subject "c".
package keyfmt

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
)

// Prefix returns the part of every key of namespace ns before the subject.
func Prefix(ns string) string { return strconv.Itoa(len(ns)) + ":" + ns + ":" }

// Key returns the key of subject in namespace ns.
func Key(ns, subject string) string { return Prefix(ns) + subject }

// Split cuts key after its prefix: prefix+subject == key. A key that is not
// framed is all subject, with the empty prefix. It allocates nothing.
func Split(key string) (prefix, subject string) {
	i, n := 0, 0
	for i < len(key) && i < 10 && key[i] >= '0' && key[i] <= '9' {
		n = n*10 + int(key[i]-'0')
		i++
	}
	if i == 0 || i >= len(key) || key[i] != ':' {
		return "", key
	}
	end := i + 1 + n
	if end >= len(key) || key[end] != ':' {
		return "", key
	}
	return key[:end+1], key[end+1:]
}

// Parse takes key apart into its namespace and subject; ok is false for a
// key that is not framed, or has an empty namespace or subject.
func Parse(key string) (ns, subject string, ok bool) {
	prefix, subject := Split(key)
	if len(prefix) < 3 || subject == "" {
		return "", "", false
	}
	_, rest, _ := strings.Cut(prefix, ":")
	ns = rest[:len(rest)-1]
	if ns == "" {
		return "", "", false
	}
	return ns, subject, true
}

// Hash returns a short, stable stand-in for a subject in log lines, error
// messages and metrics: "#" and the first 8 bytes of its SHA-256, in hex.
// It tells subjects apart; it does not give one back.
func Hash(subject string) string {
	sum := sha256.Sum256([]byte(subject))
	return "#" + hex.EncodeToString(sum[:8])
}

// Label names key without its subject, which may be personal data or a
// secret (an API key): `namespace "api", subject #1a2b3c4d5e6f7a8b`,
// `namespace "api"` for a namespace's prefix alone, or `key #...` for a key
// that is not framed.
func Label(key string) string {
	ns, subject, ok := Parse(key)
	if !ok && key != "" && IsPrefix(key) {
		_, rest, _ := strings.Cut(key, ":")
		return "namespace " + strconv.Quote(rest[:len(rest)-1])
	}
	if !ok {
		return "key " + Hash(key)
	}
	return "namespace " + strconv.Quote(ns) + ", subject " + Hash(subject)
}

// Join joins the parts of a key made of several values (a key function's
// parts): each is framed by its length, "<len>:<part>", and they are
// separated by "|", so that no two lists of parts join to the same string.
func Join(parts ...string) string {
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('|')
		}
		b.WriteString(strconv.Itoa(len(p)))
		b.WriteByte(':')
		b.WriteString(p)
	}
	return b.String()
}

// NumSlots is the number of hash slots of a Redis Cluster.
const NumSlots = 16384

// Slot returns the Redis Cluster hash slot of key, as CLUSTER KEYSLOT does:
// CRC16 (XMODEM) modulo 16384 of the key, or of its hash tag when the key
// holds a "{" followed later by a "}" with at least one byte between them.
func Slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return crc16(key) % NumSlots
}

// crc16tab is the CRC16-CCITT (XMODEM) table: polynomial 0x1021, initial
// value 0, no reflection, as Redis Cluster uses it.
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

// IDLen is the length of a reservation id made by ReservationID.
const IDLen = 24

// ReservationID returns a new id for a reservation of the bucket at key: 128
// random bits and then key's Redis Cluster slot (2 bytes, big-endian), in
// unpadded base64url, IDLen bytes. The slot is what a settle that knows the
// id alone needs to find the record on Redis Cluster (see Record); of key it
// tells nothing else: 14 bits of a CRC16, which one key in 16384 shares.
func ReservationID(key string) string {
	var b [18]byte
	rand.Read(b[:16])
	binary.BigEndian.PutUint16(b[16:], Slot(key))
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// IDSlot returns the slot a reservation id names (see ReservationID); ok is
// false when id is not one ReservationID makes.
func IDSlot(id string) (slot uint16, ok bool) {
	if len(id) != IDLen {
		return 0, false
	}
	var b [18]byte
	n, err := base64.RawURLEncoding.Decode(b[:], []byte(id))
	if err != nil || n != len(b) {
		return 0, false
	}
	slot = binary.BigEndian.Uint16(b[16:]) // (18 bytes are 24 characters: none has bits left over)
	if slot >= NumSlots {
		return 0, false
	}
	return slot, true
}

// IsPrefix reports whether key is a namespace's prefix alone (see Prefix),
// or empty: the key a settle by id alone passes a store in place of its
// bucket's, which it does not know (see ratelimit.Reserver).
func IsPrefix(key string) bool {
	prefix, subject := Split(key)
	return subject == "" && prefix == key
}

// Record returns the key of reservation id of the bucket at key: "{tag}r:"
// and id, where tag is the short hash tag of the bucket's slot, so that the
// record and its bucket are one script call's keys on Redis Cluster whatever
// braces key holds, and the record is found from its slot and id alone. When
// key is a prefix (IsPrefix: the bucket is not known) the slot is the one id
// names (IDSlot), or, for an id that names none, id's own.
func Record(key, id string) string {
	slot := Slot(key)
	if IsPrefix(key) {
		s, ok := IDSlot(id)
		if !ok {
			s = Slot(id)
		}
		slot = s
	}
	return "{" + slotTags()[slot] + "}r:" + id
}

// slotTags holds, for each slot, a short string of letters and digits that
// hashes to it: the first found, by length, then in order.
var slotTags = sync.OnceValue(func() *[NumSlots]string {
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	var tags [NumSlots]string
	left := NumSlots
	var walk func(prefix []byte, n int)
	walk = func(prefix []byte, n int) {
		for i := 0; i < len(alphabet) && left > 0; i++ {
			s := append(prefix, alphabet[i])
			if n > 1 {
				walk(s, n-1)
				continue
			}
			if slot := crc16(string(s)) % NumSlots; tags[slot] == "" {
				tags[slot] = string(s)
				left--
			}
		}
	}
	for n := 1; left > 0; n++ {
		walk(make([]byte, 0, n), n)
	}
	return &tags
})

// Assignments returns the Redis keys of namespace ns's assignments (see
// ratelimit.Assigner): a hash of subject → value, and a stream logging
// their changes. Both start with the hash tag "{" + Prefix(ns) + "}", so
// that they live in one Cluster slot; no bucket key starts with "{" (each
// starts with its length frame's digits), and no reservation record's tag
// holds a ":" (see Record), so they collide with neither.
func Assignments(ns string) (hash, log string) {
	tag := "{" + Prefix(ns) + "}"
	return tag + "assignments", tag + "assignments:log"
}

// AssignmentRule returns the rule an assignment's namespace and subject
// break, "" when none: neither may be empty. A store refuses them with an
// error wrapping ratelimit.ErrInvalidArgument that names it.
func AssignmentRule(ns, subject string) string {
	switch {
	case ns == "":
		return "namespace must not be empty"
	case subject == "":
		return "subject must not be empty"
	}
	return ""
}
