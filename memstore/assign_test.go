package memstore_test

import (
	"context"
	"maps"
	"strconv"
	"testing"

	"github.com/exactlimit/ratelimit/memstore"
)

// TestAssignmentLogIsBounded: a namespace's log keeps its latest 1024
// changes; a cursor older than those lists the whole set, one within them
// the changes after it.
func TestAssignmentLogIsBounded(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	_, start, _, err := s.AssignmentsSince(ctx, "api", "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1030 {
		if _, err := s.Assign(ctx, "api", "s"+strconv.Itoa(i%20), "p:"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name     string
		cursor   string
		wantFull bool
	}{
		// Changes 7 to 1030 are kept.
		{"the start", start, true},
		{"two changes before the oldest kept", "5", true},
		{"the change before the oldest kept", "6", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changes, next, full, err := s.AssignmentsSince(ctx, "api", tc.cursor)
			if err != nil || full != tc.wantFull || len(changes) != 20 || next != "1030" {
				t.Fatalf("AssignmentsSince(%q) = %d changes, %q, full %v, %v; want 20, \"1030\", full %v", tc.cursor, len(changes), next, full, err, tc.wantFull)
			}
			want := map[string]string{}
			for i := 1010; i < 1030; i++ {
				want["s"+strconv.Itoa(i%20)] = "p:" + strconv.Itoa(i)
			}
			if !maps.Equal(changes, want) {
				t.Fatalf("changes %v, want %v", changes, want)
			}
		})
	}
}
