package redistest

import "testing"

func TestSlotOfKnownValues(t *testing.T) {
	for key, want := range map[string]int{
		"":                      0,
		"123456789":             0x31C3 % NumSlots, // the CRC16/XMODEM check value
		"foo":                   12182,
		"bar":                   5061,
		"{user1000}.following":  SlotOf("user1000"),
		"{user1000}.followers":  SlotOf("user1000"),
		"foo{}{bar}":            SlotOf("foo{}{bar}"), // empty first tag: whole key
		"foo{{bar}}zap":         SlotOf("{bar"),
		"foo{bar}{zap}":         SlotOf("bar"),
		"{a}":                   SlotOf("a"),
		"no-closing{brace":      SlotOf("no-closing{brace"),
		"closing}before{x}":     SlotOf("x"),
		"tb:{tenant-42}:bucket": SlotOf("tenant-42"),
	} {
		if got := SlotOf(key); got != want {
			t.Errorf("SlotOf(%q) = %d; want %d", key, got, want)
		}
	}
	if SlotOf("foo{}{bar}") == SlotOf("bar") {
		t.Error("an empty first hash tag must hash the whole key")
	}
}
