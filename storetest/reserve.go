package storetest

import (
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
)

// hold is the lifetime of the suite's reservations.
const hold = time.Minute

// reserve reserves costs for subject and fails the test unless allowed.
func reserve(t *testing.T, e *env, l *ratelimit.Limiter[string], subject string, costs ...int64) *ratelimit.Reservation {
	t.Helper()
	rv, err := l.Reserve(e.ctx, subject, hold, costs...)
	if err != nil || !rv.Decision.Allowed || rv.Token() == "" {
		t.Fatalf("Reserve(%s, %v) = %+v, %v; want allowed", subject, costs, rv, err)
	}
	return rv
}

var reserveCases = []envCase{
	{"a settle gives back what was reserved and not used, once", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(100))
		rv := reserve(t, e, l, "s", 60)
		want(t, "reserve 60", rv.Decision, nil, true, 40, 0, 36*time.Second)
		d, err := rv.Settle(e.ctx, 20)
		want(t, "settle 20", d, err, true, 80, 0, 12*time.Second)
		d, err = rv.Settle(e.ctx, 0)
		if !errors.Is(err, ratelimit.ErrNotReserved) {
			t.Fatalf("second settle: %+v, %v; want ErrNotReserved", d, err)
		}
		if err := rv.Cancel(e.ctx); !errors.Is(err, ratelimit.ErrNotReserved) {
			t.Fatalf("cancel after settle: %v; want ErrNotReserved", err)
		}
		d, err = l.Peek(e.ctx, "s")
		want(t, "peek", d, err, true, 80, 0, 12*time.Second)
	}},
	{"a refund after a full refill never lifts the bucket past full", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(100))
		rv := reserve(t, e, l, "s", 60)
		e.clock.Add(40 * time.Second) // 66 tokens back: full again
		if err := rv.Cancel(e.ctx); err != nil {
			t.Fatal(err)
		}
		d, err := l.TryAcquireN(e.ctx, "s", 100)
		want(t, "the whole capacity", d, err, true, 0, 0, time.Minute)
		d, err = l.TryAcquire(e.ctx, "s")
		want(t, "one more", d, err, false, 0, 600*time.Millisecond, time.Minute)
	}},
	{"a cancel of a whole capacity on a bucket in debt keeps the debt", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(10)) // a token every 6 s
		a := reserve(t, e, l, "s", 10)
		e.clock.Add(6 * time.Second)
		b := reserve(t, e, l, "s", 1)
		d, err := b.Settle(e.ctx, 11) // 10 more than reserved, none left: 10 in debt
		want(t, "settle B with 11", d, err, false, 0, 66*time.Second, 2*time.Minute)
		if err := a.Cancel(e.ctx); err != nil {
			t.Fatal(err)
		}
		// A's 10 go back onto the debt of 10: the bucket holds 0, not 10.
		d, err = l.Peek(e.ctx, "s")
		want(t, "after A's cancel", d, err, false, 0, 6*time.Second, time.Minute)
		d, err = l.TryAcquire(e.ctx, "s")
		want(t, "a check", d, err, false, 0, 6*time.Second, time.Minute)
	}},
	{"an overrun is charged, into debt down to minus the capacity", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(60)) // a token a second
		rv := reserve(t, e, l, "s", 10)
		d, err := rv.Settle(e.ctx, 100) // 90 more than reserved, 50 left: 40 in debt
		want(t, "settle 100", d, err, false, 0, 41*time.Second, 100*time.Second)
		d, err = l.TryAcquire(e.ctx, "s")
		want(t, "in debt", d, err, false, 0, 41*time.Second, 100*time.Second)
		if rv, err := l.Reserve(e.ctx, "s", hold, 1); err != nil || rv.Decision.Allowed {
			t.Fatalf("reserve in debt = %+v, %v; want denied", rv, err)
		}
		e.clock.Add(41 * time.Second)
		rv = reserve(t, e, l, "s", 1)
		d, err = rv.Settle(e.ctx, 1_000_000) // the floor: 60 in debt
		want(t, "settle far beyond", d, err, false, 0, 61*time.Second, 120*time.Second)
	}},
	{"requests and tokens are one decision, each limit its own cost", func(t *testing.T, e *env) {
		rpm, tpm := ratelimit.PerMinute(3), ratelimit.PerMinute(1000)
		l := e.newLimiter(rpm, tpm)
		first := reserve(t, e, l, "s", 1, 600)
		rv, err := l.Reserve(e.ctx, "s", hold, 1, 600)
		if err != nil || rv.Decision.Allowed || rv.Decision.Limit != tpm || rv.Token() != "" {
			t.Fatalf("second reserve = %+v, %v; want denied by the tokens limit", rv, err)
		}
		if _, err := rv.Settle(e.ctx, 1, 0); !errors.Is(err, ratelimit.ErrNotReserved) {
			t.Fatalf("settle of a denied reserve: %v; want ErrNotReserved", err)
		}
		if _, err := first.Settle(e.ctx, 1, 200); err != nil {
			t.Fatal(err)
		}
		rv = reserve(t, e, l, "s", 1, 600)
		if got := rv.Decision.Remaining; got != 1 {
			t.Fatalf("after two reserves, remaining %d; want 1 (requests)", got)
		}
		d, err := l.TryAcquire(e.ctx, "s") // 1 request and 1 token: the third request
		want(t, "third request", d, err, true, 0, 0, time.Minute)
	}},
	{"a token settles from another limiter sharing the store, once", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(100))
		other := e.newLimiter(ratelimit.PerMinute(100))
		rv := reserve(t, e, l, "s", 50)
		d, err := other.Settle(e.ctx, rv.Token(), 10)
		want(t, "settle elsewhere", d, err, true, 90, 0, 6*time.Second)
		if _, err := rv.Settle(e.ctx, 10); !errors.Is(err, ratelimit.ErrNotReserved) {
			t.Fatalf("settle here after: %v; want ErrNotReserved", err)
		}
	}},
	{"a token reveals nothing of the subject", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(100))
		const apiKey = "sk-live-7Hq2Zx9LmP4vRt8Kw3Ny"
		rv := reserve(t, e, l, apiKey, 1)
		for _, secret := range []string{apiKey, l.Key(apiKey), apiKey[:8], apiKey[len(apiKey)-8:]} {
			if where := reveals(rv.Token(), secret); where != "" {
				t.Fatalf("token %q holds %q %s", rv.Token(), secret, where)
			}
		}
		d, err := l.Settle(e.ctx, rv.Token(), 0)
		want(t, "settle by token", d, err, true, 100, 0, 0)
	}},
	{"concurrent settles of one reservation refund once", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(100))
		rv := reserve(t, e, l, "s", 100)
		var wg sync.WaitGroup
		var mu sync.Mutex
		settled := 0
		for range 8 {
			wg.Go(func() {
				_, err := l.Settle(e.ctx, rv.Token(), 0)
				switch {
				case err == nil:
					mu.Lock()
					settled++
					mu.Unlock()
				case !errors.Is(err, ratelimit.ErrNotReserved):
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if settled != 1 {
			t.Fatalf("%d settles refunded; want 1", settled)
		}
		d, err := l.Peek(e.ctx, "s")
		want(t, "peek", d, err, true, 100, 0, 0)
	}},
	{"a reservation of another subject or namespace is not found", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(100))
		rv := reserve(t, e, l, "s", 50)
		// The token's 128 random bits with another slot (its last 2 bytes).
		b, err := base64.RawURLEncoding.DecodeString(rv.Token())
		if err != nil || len(b) != 18 {
			t.Fatalf("token %q is not 18 bytes of base64url: %v", rv.Token(), err)
		}
		b[16] ^= 0x01
		if _, err := l.Settle(e.ctx, base64.RawURLEncoding.EncodeToString(b), 0); !errors.Is(err, ratelimit.ErrNotReserved) {
			t.Fatalf("the id with another slot: %v; want ErrNotReserved", err)
		}
		// The store asked to settle the reservation on another subject's
		// bucket.
		r := ratelimit.Request{Limits: l.Limits(), Now: e.clock.Now()}
		if _, err := l.Store().(ratelimit.Reserver).Settle(e.ctx, l.Key("t"), rv.Token(), r, []int64{0}); !errors.Is(err, ratelimit.ErrNotReserved) {
			t.Fatalf("the id on another subject: %v; want ErrNotReserved", err)
		}
		elsewhere, err := ratelimit.New[string](l.Store(), ratelimit.PerMinute(100), ratelimit.WithNamespace(l.Namespace()+"-other"), ratelimit.WithClock(e.clock.Now))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := elsewhere.Settle(e.ctx, rv.Token(), 0); !errors.Is(err, ratelimit.ErrNotReserved) {
			t.Fatalf("another namespace: %v; want ErrNotReserved", err)
		}
		d, err := rv.Settle(e.ctx, 50)
		want(t, "its own settle", d, err, true, 50, 0, 30*time.Second)
	}},
	{"a refund gives a cost back, capped at capacity", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(3), ratelimit.PerMinute(1000))
		store, ok := l.Store().(ratelimit.Refunder)
		if !ok {
			t.Fatalf("%T holds reservations but cannot refund", l.Store())
		}
		key := l.Key("s")
		at := func(costs ...int64) ratelimit.Request {
			return ratelimit.Request{Limits: l.Limits(), Costs: costs, Now: e.clock.Now()}
		}
		if d, err := l.Store().Apply(e.ctx, key, at(2, 900)); err != nil || !d.Allowed || d.Remaining != 1 {
			t.Fatalf("take 2 and 900 = %+v %v", d, err)
		}
		d, err := store.Refund(e.ctx, key, at(1, 500))
		want(t, "refund 1 and 500", d, err, true, 2, 0, 24*time.Second)
		d, err = store.Refund(e.ctx, key, at(3, 1000)) // beyond what was taken: capped at full
		want(t, "refund beyond", d, err, true, 3, 0, 0)
		if _, err := store.Refund(e.ctx, key, at(4, 1)); !errors.Is(err, ratelimit.ErrInvalidArgument) {
			t.Fatalf("a refund beyond capacity: %v; want ErrInvalidArgument", err)
		}
		if _, err := store.Refund(e.ctx, key, ratelimit.Request{Limits: l.Limits(), Peek: true}); !errors.Is(err, ratelimit.ErrInvalidArgument) {
			t.Fatalf("a peek refund: %v; want ErrInvalidArgument", err)
		}
	}},
	{"invalid reserves and settles are refused before the store", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(3), ratelimit.PerMinute(1000))
		for _, costs := range [][]int64{{4}, {0}, {1, 1001}, {1, 0}, {1, 2, 3}, {}} {
			if _, err := l.Reserve(e.ctx, "s", hold, costs...); !errors.Is(err, ratelimit.ErrInvalidArgument) {
				t.Errorf("Reserve(%v): %v; want ErrInvalidArgument", costs, err)
			}
		}
		if _, err := l.Reserve(e.ctx, "s", time.Microsecond, 1); !errors.Is(err, ratelimit.ErrInvalidArgument) {
			t.Errorf("Reserve for 1µs: %v; want ErrInvalidArgument", err)
		}
		rv := reserve(t, e, l, "s", 1, 10)
		for _, actual := range [][]int64{{-1}, {1, 2, 3}, {}, {1, -5}, {1 << 54}} {
			if _, err := rv.Settle(e.ctx, actual...); !errors.Is(err, ratelimit.ErrInvalidArgument) {
				t.Errorf("Settle(%v): %v; want ErrInvalidArgument", actual, err)
			}
		}
		earlier := rv.Token()[:22] + "." + base64.RawURLEncoding.EncodeToString([]byte("s")) // the id and the subject
		for _, token := range []string{"", "x", "x.y", rv.Token()[:21] + "." + "cw", rv.Token() + "!", earlier} {
			if _, err := l.Settle(e.ctx, token, 0); !errors.Is(err, ratelimit.ErrInvalidArgument) {
				t.Errorf("Settle(%q): %v; want ErrInvalidArgument", token, err)
			}
		}
		if _, err := rv.Settle(e.ctx, 1, 10); err != nil {
			t.Fatalf("the valid settle after them: %v", err)
		}
		store := l.Store().(ratelimit.Reserver)
		key := l.Key("s")
		r := ratelimit.Request{Limits: l.Limits(), Cost: 1, Now: e.clock.Now()}
		if _, err := store.Reserve(e.ctx, key, "", r, hold); !errors.Is(err, ratelimit.ErrInvalidArgument) {
			t.Errorf("store Reserve without an id: %v", err)
		}
		if _, err := store.Settle(e.ctx, key, "id", r, []int64{1}); !errors.Is(err, ratelimit.ErrInvalidArgument) {
			t.Errorf("store Settle with one count for two limits: %v", err)
		}
	}},
}

// reveals reports where token holds secret: as it is, or in any base64
// encoding of any run of the token's characters between characters that are
// not base64's ("" when nowhere).
func reveals(token, secret string) string {
	if strings.Contains(token, secret) {
		return "as it is"
	}
	isB64 := func(r rune) bool {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_+/=", r)
	}
	parts := strings.FieldsFunc(token, func(r rune) bool { return !isB64(r) })
	for _, p := range parts {
		p = strings.TrimRight(p, "=")
		// Every start, so that a part that is not aligned on base64's
		// 4-character groups is decoded too.
		for i := range len(p) {
			for _, enc := range []*base64.Encoding{base64.RawURLEncoding, base64.RawStdEncoding} {
				q := p[i:]
				for len(q) > 0 {
					if b, err := enc.DecodeString(q); err == nil {
						if strings.Contains(string(b), secret) {
							return "in base64 " + strconv.Quote(p)
						}
						break
					}
					q = q[:len(q)-1]
				}
			}
		}
	}
	return ""
}
