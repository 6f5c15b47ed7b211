package keyfmt

import (
	"strings"
	"testing"
)

func TestSplitAndParse(t *testing.T) {
	for _, tt := range []struct {
		key, prefix, subject, ns string
		ok                       bool
	}{
		{"3:api:user:1", "3:api:", "user:1", "api", true},
		{"1:a:b:c", "1:a:", "b:c", "a", true},
		{"3:a:b:c", "3:a:b:", "c", "a:b", true},
		{"7:default:", "7:default:", "", "", false}, // no subject
		{"0::x", "0::", "x", "", false},             // empty namespace
		{"x:api:s", "", "x:api:s", "", false},
		{"9:api:s", "", "9:api:s", "", false}, // the length runs past the key
		{"12345678901:a:b", "", "12345678901:a:b", "", false},
		{"", "", "", "", false},
	} {
		prefix, subject := Split(tt.key)
		if prefix != tt.prefix || subject != tt.subject || prefix+subject != tt.key {
			t.Errorf("Split(%q) = %q, %q; want %q, %q", tt.key, prefix, subject, tt.prefix, tt.subject)
		}
		ns, subj, ok := Parse(tt.key)
		if ok != tt.ok || (ok && (ns != tt.ns || subj != tt.subject)) {
			t.Errorf("Parse(%q) = %q, %q, %v; want %q, %q, %v", tt.key, ns, subj, ok, tt.ns, tt.subject, tt.ok)
		}
	}
	if k := Key("a:b", "c"); k != "3:a:b:c" {
		t.Errorf("Key = %q", k)
	}
}

func TestLabelHidesTheSubject(t *testing.T) {
	l := Label(Key("api", "sk_live_SECRET"))
	if strings.Contains(l, "SECRET") || !strings.HasPrefix(l, `namespace "api", subject #`) || len(Hash("x")) != 17 {
		t.Errorf("Label = %q", l)
	}
	if l := Label("raw-SECRET"); strings.Contains(l, "SECRET") || !strings.HasPrefix(l, "key #") {
		t.Errorf("Label of an unframed key = %q", l)
	}
}

func TestJoinKeepsPartsApart(t *testing.T) {
	if Join("a|1:b") == Join("a", "b") || Join("ab", "c") == Join("a", "bc") {
		t.Error("two lists of parts joined to the same key")
	}
	if got := Join("GET /x", "10.0.0.1"); got != "6:GET /x|8:10.0.0.1" {
		t.Errorf("Join = %q", got)
	}
}

func TestSlot(t *testing.T) {
	// Values from CLUSTER KEYSLOT.
	for key, want := range map[string]uint16{"": 0, "foo": 12182, "{user1000}.following": 3443, "{user1000}.followers": 3443, "foo{}{bar}": 8363} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestRecordSharesItsBucketsSlot(t *testing.T) {
	for _, key := range []string{"7:default:user", "3:api:a{b}c", "3:api:a{}b", "3:api:a{b", "3:api:}{x}", "{", "}{", "raw"} {
		id := ReservationID(key)
		rec := Record(key, id)
		if Slot(rec) != Slot(key) {
			t.Errorf("Record(%q) = %q in slot %d, its bucket in %d", key, rec, Slot(rec), Slot(key))
		}
		if Record(key, "id2") == rec || !strings.HasSuffix(rec, "}r:"+id) {
			t.Errorf("Record(%q, %q) = %q does not name its id", key, id, rec)
		}
		// A settle that knows the id alone finds the same record.
		for _, prefix := range []string{"", "3:api:", "7:default:"} {
			if got := Record(prefix, id); got != rec {
				t.Errorf("Record(%q, %q) = %q; the bucket's own is %q", prefix, id, got, rec)
			}
		}
	}
	for s, tag := range slotTags() {
		if tag == "" || Slot(tag) != uint16(s) {
			t.Fatalf("slot %d has tag %q", s, tag)
		}
	}
}

func TestReservationID(t *testing.T) {
	key := Key("api", "sk_live_SECRET")
	a, b := ReservationID(key), ReservationID(key)
	if a == b || len(a) != IDLen {
		t.Fatalf("ReservationID = %q, then %q", a, b)
	}
	if slot, ok := IDSlot(a); !ok || slot != Slot(key) {
		t.Fatalf("IDSlot(%q) = %d, %v; want %d", a, slot, ok, Slot(key))
	}
	for _, bad := range []string{
		"", "x", a[:IDLen-1], a + "A", a[:10] + "." + a[11:],
		"AAAAAAAAAAAAAAAAAAAAAEAA", // slot 16384
	} {
		if slot, ok := IDSlot(bad); ok {
			t.Errorf("IDSlot(%q) = %d, true; want false", bad, slot)
		}
	}
	if slot, ok := IDSlot("AAAAAAAAAAAAAAAAAAAAAD__"); !ok || slot != NumSlots-1 {
		t.Errorf("IDSlot of slot 16383 = %d, %v", slot, ok)
	}
}

func TestIsPrefix(t *testing.T) {
	for key, want := range map[string]bool{"": true, "3:api:": true, "0::": true, "3:api:s": false, "raw": false, "3:api": false} {
		if got := IsPrefix(key); got != want {
			t.Errorf("IsPrefix(%q) = %v", key, got)
		}
	}
	if l := Label(Prefix("api")); l != `namespace "api"` {
		t.Errorf("Label of a prefix = %q", l)
	}
}

func TestAssignmentsKeys(t *testing.T) {
	for _, ns := range []string{"api", "a}b", "{x}", "a:b"} {
		hash, log := Assignments(ns)
		if Slot(hash) != Slot(log) {
			t.Errorf("namespace %q: %q and %q are in slots %d and %d", ns, hash, log, Slot(hash), Slot(log))
		}
		if _, _, ok := Parse(hash); ok || hash[0] != '{' {
			t.Errorf("namespace %q: %q reads as a bucket's key", ns, hash)
		}
	}
	if a, _ := Assignments("a"); a != "{1:a:}assignments" {
		t.Errorf(`Assignments("a") = %q`, a)
	}
}
