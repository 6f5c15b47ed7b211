package redisstore_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// TestAQuotaOnAServerClockBehindTheCaller: the caller gives the windows of
// a quota around its own clock; a server whose clock is still in the
// previous window (an hour behind, across midnight) decides in that window,
// and the caller's window is a fresh one once the server's clock is in it.
// For a policy of a limit and one quota (the script's shortest path) and of
// two quotas.
func TestAQuotaOnAServerClockBehindTheCaller(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	if err := client.FunctionLoad(ctx, script.Library).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	caller := time.Date(2026, 3, 10, 0, 30, 0, 0, time.UTC)
	server := caller.Add(-time.Hour) // 23:30 the day before
	for _, tc := range []struct {
		name   string
		quotas []ratelimit.Quota
	}{
		{"one quota", []ratelimit.Quota{ratelimit.CalendarQuota(3, ratelimit.Day, time.UTC)}},
		{"two quotas", []ratelimit.Quota{ratelimit.CalendarQuota(3, ratelimit.Day, time.UTC), ratelimit.CalendarQuota(100, ratelimit.Month, time.UTC)}},
	} {
		r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(1000)}, Quotas: tc.quotas, Cost: 1, Now: caller}
		args := new(script.Encoder).Args(r)
		check := func(at time.Time) ratelimit.Decision {
			t.Helper()
			args[0] = at.UnixMicro() // the server's clock, as its TIME would give it
			res, err := client.FCall(ctx, script.Function, []string{"behind:" + tc.name}, args...).Result()
			if err != nil {
				t.Fatal(err)
			}
			d, err := script.ParseReply(r, res)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		for i := range 3 {
			if d := check(server.Add(time.Duration(i) * time.Second)); !d.Allowed {
				t.Fatalf("%s: check %d on the server's day: %+v", tc.name, i, d)
			}
		}
		if d := check(server.Add(3 * time.Second)); d.Allowed || d.Binding != 1 || d.RetryAfter != 30*time.Minute-3*time.Second {
			t.Errorf("%s: the 4th on the server's day: %+v; want denied by the quota until its midnight", tc.name, d)
		}
		if d := check(caller); !d.Allowed || d.Remaining != 2 || d.Standings[1].Remaining != 2 {
			t.Errorf("%s: on the caller's day: %+v; want its first of 3", tc.name, d)
		}
	}
}

// TestABindingTieIsTheFirstPart: when a limit and a quota have as many
// tokens left, the decision is bound by the limit (the first of them), as
// the Go step decides.
func TestABindingTieIsTheFirstPart(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(10)}, Quotas: []ratelimit.Quota{ratelimit.CalendarQuota(10, ratelimit.Day, time.UTC)},
		Cost: 1, Now: time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)}
	for _, s := range []ratelimit.Store{redisstore.New(client), memstore.New()} {
		d, err := s.Apply(ctx, "tie", r)
		if err != nil || !d.Allowed || d.Remaining != 9 || d.Binding != 0 {
			t.Errorf("%T: %+v %v; want allowed, 9 left, bound by the limit", s, d, err)
		}
	}
}

// TestAClockBehindAQuotaWindowsEnd: checks of a limit and a quota on a clock
// that goes back across the end of the quota's window, and on a bucket whose
// limit is full while its quota has used tokens (a settle that gave the
// limit's token back and kept the quota's), decided by redisstore as by
// memstore (the Go step): the bucket's own time, not the caller's earlier
// one, picks the window and the refill.
func TestAClockBehindAQuotaWindowsEnd(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	rs, ms := redisstore.New(client), memstore.New()
	midnight := time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC)
	policy := func(at time.Time) ratelimit.Request {
		return ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(1000)},
			Quotas: []ratelimit.Quota{ratelimit.CalendarQuota(5, ratelimit.Day, time.UTC)}, Cost: 1, Now: at}
	}
	type step struct {
		op string // check, peek, reserve, settle
		at time.Time
	}
	for _, seq := range [][]step{
		// After midnight, then back before it: the bucket's time is in
		// the new day, and so is the quota's window.
		{{"check", midnight.Add(time.Second)}, {"check", midnight.Add(-time.Second)}, {"peek", midnight.Add(-time.Second)}, {"check", midnight.Add(2 * time.Second)}},
		// A full limit and a quota token used, then a check a second
		// behind: decided at the bucket's time, and refilled from it.
		{{"reserve", midnight.Add(time.Hour)}, {"settle", midnight.Add(time.Hour)}, {"check", midnight.Add(time.Hour - time.Second)}, {"peek", midnight.Add(time.Hour)}, {"peek", midnight.Add(time.Hour + time.Millisecond)}},
	} {
		key := "behind-" + seq[0].op
		for i, st := range seq {
			r := policy(st.at)
			var got, want ratelimit.Decision
			var gerr, werr error
			switch st.op {
			case "check", "peek":
				r.Peek = st.op == "peek"
				got, gerr = rs.Apply(ctx, key, r)
				want, werr = ms.Apply(ctx, key, r)
			case "reserve":
				got, gerr = rs.Reserve(ctx, key, "id", r, time.Minute)
				want, werr = ms.Reserve(ctx, key, "id", r, time.Minute)
			case "settle":
				got, gerr = rs.Settle(ctx, key, "id", r, []int64{0, 1}) // the limit's token back, the quota's kept
				want, werr = ms.Settle(ctx, key, "id", r, []int64{0, 1})
			}
			if gerr != nil || werr != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("%s step %d (%s at %v): redisstore %+v %v, memstore %+v %v", key, i, st.op, st.at, got, gerr, want, werr)
			}
		}
	}
}

// TestAMalformedQuotaBandIsAnError: a stored bucket of a limit and a quota in
// the policy's own terms (as a check of it reads them without converting)
// whose quota band is out of range is an error that grants nothing.
func TestAMalformedQuotaBandIsAnError(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	rs := redisstore.New(client)
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	limit := ratelimit.PerSecond(10)
	r := ratelimit.Request{Limits: []ratelimit.Limit{limit}, Quotas: []ratelimit.Quota{ratelimit.CalendarQuota(5, ratelimit.Day, time.UTC)}, Cost: 1, Now: now}
	day := now.Truncate(24 * time.Hour)
	state := func(s, e, u int64) string {
		b := appendUint7([]byte{3}, now.UnixMicro())
		b = append(b, 1, 1)
		band := lowest(limit, 5, 0)
		for _, v := range []int64{band.Level, band.Limit.Capacity, band.Limit.RefillTokens, band.Limit.RefillPeriod.Microseconds(), s, e, u} {
			b = appendUint7(b, v)
		}
		return string(b)
	}
	s, e := day.UnixMicro(), day.Add(24*time.Hour).UnixMicro()
	if err := client.Set(ctx, "qband", state(s, e, 2), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if d, err := rs.Apply(ctx, "qband", r); err != nil || !d.Allowed || d.Standings[1].Remaining != 2 {
		t.Fatalf("a valid quota band: %+v %v; want allowed, 2 left of 5", d, err)
	}
	for _, bad := range []string{
		state(e, s, 2),      // a window that ends before it starts
		state(s, s, 2),      // an empty window
		state(-1<<54, e, 2), // a start below -2^53
		state(s, 1<<54, 2),  // an end above 2^53
		state(s, e, 1<<54),  // more used than 2^53
	} {
		client.Set(ctx, "qband", bad, time.Minute)
		if d, err := rs.Apply(ctx, "qband", r); !errors.Is(err, tokenbucket.ErrCorruptState) || d.Allowed {
			t.Errorf("stored %x: %+v %v; want an error wrapping ErrCorruptState", bad, d, err)
		}
	}
}
