package httplimit

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

func TestSetOpenAIHeaders(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	st := memstore.New(memstore.WithClock(clock))
	lim, err := ratelimit.NewMulti[string](st, []ratelimit.Limit{ratelimit.PerMinute(60), ratelimit.PerMinute(90000)}, ratelimit.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Reserve(ctx, "acme", time.Minute, 1, 22500); err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	if err := SetOpenAIHeaders(ctx, h, lim, "acme"); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"x-ratelimit-limit-requests":     "60",
		"x-ratelimit-limit-tokens":       "90000",
		"x-ratelimit-remaining-requests": "59",
		"x-ratelimit-remaining-tokens":   "67500",
		"x-ratelimit-reset-requests":     "1s",
		"x-ratelimit-reset-tokens":       "15s",
	} {
		if got := h.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	// The peeks took nothing.
	if d, _ := lim.Peek(ctx, "acme"); d.Remaining != 59 {
		t.Errorf("after the headers: %+v", d)
	}
	one, _ := ratelimit.New[string](st, ratelimit.PerMinute(60))
	if err := SetOpenAIHeaders(ctx, http.Header{}, one, "acme"); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Errorf("a limiter of one limit: %v", err)
	}
}
