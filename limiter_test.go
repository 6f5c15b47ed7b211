package ratelimit_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

// recorder is a Store that records what reaches it.
type recorder struct {
	keys []string
	reqs []ratelimit.Request
}

func (r *recorder) Apply(_ context.Context, key string, req ratelimit.Request) (ratelimit.Decision, error) {
	r.keys = append(r.keys, key)
	r.reqs = append(r.reqs, req)
	return ratelimit.Decision{Allowed: true}, nil
}

func (r *recorder) Reset(_ context.Context, key string) error {
	r.keys = append(r.keys, "reset "+key)
	return nil
}

func TestKeysAreLengthFramed(t *testing.T) {
	a, err := ratelimit.New[string](&recorder{}, ratelimit.PerSecond(1), ratelimit.WithNamespace("a"))
	if err != nil {
		t.Fatal(err)
	}
	ab, err := ratelimit.New[string](&recorder{}, ratelimit.PerSecond(1), ratelimit.WithNamespace("a:b"))
	if err != nil {
		t.Fatal(err)
	}
	k1, k2 := a.Key("b:c"), ab.Key("c")
	if k1 == k2 {
		t.Fatalf(`namespace "a" + subject "b:c" and namespace "a:b" + subject "c" share the key %q`, k1)
	}
	if k1 != "1:a:b:c" || k2 != "3:a:b:c" {
		t.Fatalf("keys = %q, %q; want %q, %q", k1, k2, "1:a:b:c", "3:a:b:c")
	}
	def, _ := ratelimit.New[string](&recorder{}, ratelimit.PerSecond(1))
	if got := def.Key("user:42"); got != "7:default:user:42" {
		t.Fatalf("default namespace key = %q, want %q", got, "7:default:user:42")
	}
}

type userID string
type point struct{ X, Y int }

func TestSubjectTypes(t *testing.T) {
	store := &recorder{}
	check := func(name string, key string, want string) {
		t.Helper()
		if key != want {
			t.Errorf("%s: key %q, want %q", name, key, want)
		}
	}
	s, _ := ratelimit.New[string](store, ratelimit.PerSecond(1))
	check("string", s.Key("x"), "7:default:x")
	named, err := ratelimit.New[userID](store, ratelimit.PerSecond(1))
	if err != nil {
		t.Fatalf("named string type: %v", err)
	}
	check("named string", named.Key("u1"), "7:default:u1")
	id, err := ratelimit.NewEncoded(store, func(id int64) string { return strconv.FormatInt(id, 10) }, []ratelimit.Limit{ratelimit.PerSecond(1)})
	if err != nil {
		t.Fatal(err)
	}
	check("int64 by strconv", id.Key(-42), "7:default:-42")
	p, err := ratelimit.NewEncoded(store, func(p point) string { return strings.Repeat("x", p.X) + "|" + strings.Repeat("y", p.Y) }, []ratelimit.Limit{ratelimit.PerSecond(1)})
	if err != nil {
		t.Fatal(err)
	}
	check("struct", p.Key(point{1, 2}), "7:default:x|yy")
	if _, err := ratelimit.NewEncoded[point](store, nil, []ratelimit.Limit{ratelimit.PerSecond(1)}); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Errorf("nil encode: err = %v, want ErrInvalidArgument", err)
	}
	// A subject that encodes to "" is refused before the store.
	if _, err := p.TryAcquire(context.Background(), point{}); err != nil {
		t.Errorf("point{} encodes to %q: err = %v", "|", err)
	}
	empty, _ := ratelimit.NewEncoded(store, func(int) string { return "" }, []ratelimit.Limit{ratelimit.PerSecond(1)})
	if _, err := empty.TryAcquire(context.Background(), 1); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Errorf("empty encoding: err = %v, want ErrInvalidArgument", err)
	}
}

func TestInvalidInputNeverReachesTheStore(t *testing.T) {
	store := &recorder{}
	ctx := context.Background()
	if _, err := ratelimit.New[string](nil, ratelimit.PerSecond(1)); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Errorf("nil store: err = %v", err)
	}
	if _, err := ratelimit.New[string](store, ratelimit.Limit{}); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Errorf("zero limit: err = %v", err)
	}
	if _, err := ratelimit.New[string](store, ratelimit.PerSecond(1), ratelimit.WithNamespace("")); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Errorf("empty namespace: err = %v", err)
	}
	if _, err := ratelimit.NewMulti[string](store, nil); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Errorf("no limits: err = %v", err)
	}
	l, _ := ratelimit.New[string](store, ratelimit.PerSecond(10))
	before := time.Unix(-1, 0)
	early, _ := ratelimit.New[string](store, ratelimit.PerSecond(10), ratelimit.WithClock(func() time.Time { return before }))
	calls := []struct {
		name string
		call func() error
	}{
		{"cost 0", func() error { _, err := l.TryAcquireN(ctx, "s", 0); return err }},
		{"cost above capacity", func() error { _, err := l.TryAcquireN(ctx, "s", 11); return err }},
		{"empty subject", func() error { _, err := l.TryAcquire(ctx, ""); return err }},
		{"empty subject peek", func() error { _, err := l.Peek(ctx, ""); return err }},
		{"empty subject reset", func() error { return l.Reset(ctx, "") }},
		{"clock before the epoch", func() error { _, err := early.TryAcquire(ctx, "s"); return err }},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, ratelimit.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", c.name, err)
		}
	}
	if len(store.keys) != 0 {
		t.Fatalf("invalid input reached the store: %v", store.keys)
	}
}

func TestLimiterPassesThePolicyAndClock(t *testing.T) {
	store := &recorder{}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	l, err := ratelimit.NewMulti[string](store, []ratelimit.Limit{ratelimit.PerSecond(10), ratelimit.PerHour(100)},
		ratelimit.WithNamespace("api"), ratelimit.WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l.TryAcquireN(ctx, "k", 3)
	l.Peek(ctx, "k")
	l.Reset(ctx, "k")
	if len(store.reqs) != 2 || store.reqs[0].Cost != 3 || store.reqs[0].Peek || !store.reqs[1].Peek ||
		!store.reqs[0].Now.Equal(now) || len(store.reqs[0].Limits) != 2 {
		t.Fatalf("requests = %+v", store.reqs)
	}
	if want := []string{"3:api:k", "3:api:k", "reset 3:api:k"}; strings.Join(store.keys, ",") != strings.Join(want, ",") {
		t.Fatalf("keys = %v, want %v", store.keys, want)
	}
	// Without WithClock the store's own clock decides.
	plain, _ := ratelimit.New[string](store, ratelimit.PerSecond(1))
	plain.TryAcquire(ctx, "k")
	if last := store.reqs[len(store.reqs)-1]; !last.Now.IsZero() {
		t.Fatalf("a limiter without a clock sent Now = %v, want the zero time", last.Now)
	}
}

func TestLimiterOnMemstore(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l, err := ratelimit.New[string](memstore.New(), ratelimit.PerSecond(2), ratelimit.WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, want := range []bool{true, true, false} {
		d, err := l.TryAcquire(ctx, "alice")
		if err != nil || d.Allowed != want {
			t.Fatalf("check %d = %+v, %v; want allowed=%v", i, d, err, want)
		}
	}
	if d, _ := l.TryAcquire(ctx, "bob"); !d.Allowed {
		t.Fatal("bob was denied by alice's bucket")
	}
	now = now.Add(500 * time.Millisecond)
	if d, _ := l.TryAcquire(ctx, "alice"); !d.Allowed {
		t.Fatal("alice denied after a token refilled")
	}
	if err := l.Reset(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Peek(ctx, "alice"); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("after Reset, Peek = %+v, want a full bucket of 2", d)
	}
}

func TestLimitsReturnsACopy(t *testing.T) {
	l, err := ratelimit.New[string](memstore.New(), ratelimit.PerSecond(2))
	if err != nil {
		t.Fatal(err)
	}
	got := l.Limits()
	got[0] = ratelimit.PerSecond(1000)
	if again := l.Limits(); again[0] != ratelimit.PerSecond(2) {
		t.Fatalf("after changing the returned slice, Limits() = %v, want the policy unchanged", again)
	}
	ctx := context.Background()
	l.TryAcquireN(ctx, "k", 2)
	if d, _ := l.TryAcquire(ctx, "k"); d.Allowed {
		t.Fatal("a check admitted a third token: the policy changed under the limiter")
	}
}
