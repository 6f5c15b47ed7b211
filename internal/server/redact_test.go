package server

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

func TestSubjectsStayOutOfTheLog(t *testing.T) {
	secret := "sk_live_" + strings.Repeat("9", 40)
	key := "7:default:" + secret
	store := downStore{err: fmt.Errorf("redis check of %q: %w", key, errors.New("EOF"))}
	s, _, logs := newService(t, Options{Store: store})
	base := testkit.Serve(t, s.Handler())
	if code, _ := post(t, base, "/v1/acquire", "application/json", `{"subject":"`+secret+`"}`); code != 503 {
		t.Fatalf("status %d, want 503", code)
	}
	if strings.Contains(logs.String(), secret) || !strings.Contains(logs.String(), keyfmt.Hash(secret)) {
		t.Errorf("the log shows the subject, or not its hash:\n%s", logs.String())
	}
	long := strings.Repeat("x", 1<<20)
	msg := RedactKeys(fmt.Sprintf("redis check of %q: EOF", "9:namespace:"+long))
	if len(msg) > 400 || strings.Contains(msg, "xxxxxxxx") || !strings.Contains(msg, `"namespace:#`) {
		t.Errorf("a 1 MiB key in an error: %d bytes, %.120q", len(msg), msg)
	}
}
