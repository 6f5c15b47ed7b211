package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/exactlimit/ratelimit/tokenbucket"
	"github.com/redis/go-redis/v9"
)

// TestTwoClientsSettleOneReservationOnce: limiters on two clients of one
// server (two processes, as far as Redis can tell) settle the same token at
// once, many times over: each reservation refunds exactly once.
func TestTwoClientsSettleOneReservationOnce(t *testing.T) {
	srv, client := standalone(t)
	other := redistest.NewClient(srv.Addr())
	t.Cleanup(func() { other.Close() })
	ctx := context.Background()
	limit := ratelimit.PerHour(1000)
	a, _ := ratelimit.New[string](redisstore.New(client), limit, ratelimit.WithNamespace("two"))
	b, _ := ratelimit.New[string](redisstore.New(other), limit, ratelimit.WithNamespace("two"))
	for round := range 50 {
		rv, err := a.Reserve(ctx, "tenant", time.Minute, 100)
		if err != nil || !rv.Decision.Allowed {
			t.Fatalf("round %d: reserve %+v %v", round, rv, err)
		}
		var wg sync.WaitGroup
		refunds := make(chan error, 2)
		for _, l := range []*ratelimit.Limiter[string]{a, b} {
			wg.Go(func() {
				_, err := l.Settle(ctx, rv.Token(), 0)
				refunds <- err
			})
		}
		wg.Wait()
		close(refunds)
		settled := 0
		for err := range refunds {
			switch {
			case err == nil:
				settled++
			case !errors.Is(err, ratelimit.ErrNotReserved):
				t.Fatal(err)
			}
		}
		if settled != 1 {
			t.Fatalf("round %d: %d settles refunded, want 1", round, settled)
		}
	}
	d, err := a.Peek(ctx, "tenant")
	if err != nil || d.Remaining < 999 { // everything back, but what refilled
		t.Fatalf("after 50 reserves each cancelled once: %+v %v", d, err)
	}
}

// TestAReservationRecordLivesForItsTTL: the record beside the bucket expires
// with the reservation's ttl, and a reservation whose record is gone is kept
// as taken.
func TestAReservationRecordLivesForItsTTL(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	l, _ := ratelimit.New[string](redisstore.New(client), ratelimit.PerHour(1000), ratelimit.WithNamespace("ttl"))
	rv, err := l.Reserve(ctx, "tenant", 90*time.Second, 100)
	if err != nil || !rv.Decision.Allowed {
		t.Fatal(rv, err)
	}
	record := keyfmt.Record(l.Key("tenant"), rv.Token())
	pttl, err := client.PTTL(ctx, record).Result()
	if err != nil || pttl > 90*time.Second || pttl < 80*time.Second {
		t.Fatalf("record %q PTTL %v %v; want about 90s", record, pttl, err)
	}
	client.Del(ctx, record) // as its expiry would
	if err := rv.Cancel(ctx); !errors.Is(err, ratelimit.ErrNotReserved) {
		t.Fatalf("cancel without a record: %v; want ErrNotReserved", err)
	}
	if d, err := l.Peek(ctx, "tenant"); err != nil || d.Remaining > 901 {
		t.Fatalf("after the expired reservation: %+v %v; want the 100 kept", d, err)
	}
}

// TestSettleByTokenOnCluster: on a Cluster of three masters, a limiter on a
// client of its own (another process, as far as Redis can tell) settles by
// token the reservations of subjects on every master. The settle's one key
// is the record, in the bucket's slot, found from the token alone; the
// script settles the bucket the record names and deletes the record. So as a
// function (FCALL), and as a script (EVALSHA) where an ACL denies FUNCTION.
func TestSettleByTokenOnCluster(t *testing.T) {
	for _, tc := range []struct {
		name    string
		scripts bool
	}{
		{"functions", false},
		{"scripts", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cluster := redistest.StartCluster(t, 3, 0)
			ctx := context.Background()
			var masters []redis.UniversalClient
			for _, m := range cluster.Masters() {
				c := redistest.Client(t, m.Addr())
				if tc.scripts {
					if err := c.Do(ctx, "ACL", "SETUSER", "default", "-function").Err(); err != nil {
						t.Fatal(err)
					}
				}
				masters = append(masters, c)
			}
			a := redistest.NewClusterClient(cluster.Addrs()...)
			b := redistest.NewClusterClient(cluster.Addrs()...)
			t.Cleanup(func() { a.Close(); b.Close() })
			limit := ratelimit.PerHour(1000)
			here, _ := ratelimit.New[string](redisstore.New(a), limit, ratelimit.WithNamespace("cluster"))
			there, _ := ratelimit.New[string](redisstore.New(b), limit, ratelimit.WithNamespace("cluster"))
			seen := map[string]bool{}
			for i := range 30 {
				subject := fmt.Sprintf("tenant-%d", i)
				rv, err := here.Reserve(ctx, subject, time.Minute, 100)
				if err != nil || !rv.Decision.Allowed {
					t.Fatalf("%s: reserve %+v %v", subject, rv, err)
				}
				key := here.Key(subject)
				record := keyfmt.Record(key, rv.Token())
				if keyfmt.Slot(record) != keyfmt.Slot(key) || record != keyfmt.Record("", rv.Token()) {
					t.Fatalf("%s: record %q, in slot %d; the bucket's %d", subject, record, keyfmt.Slot(record), keyfmt.Slot(key))
				}
				if n, err := a.Exists(ctx, record).Result(); err != nil || n != 1 {
					t.Fatalf("%s: record %q exists: %d %v", subject, record, n, err)
				}
				m, err := a.MasterForKey(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				seen[m.Options().Addr] = true
				d, err := there.Settle(ctx, rv.Token(), 40)
				if err != nil || !d.Allowed || d.Remaining < 959 || d.Remaining > 960 {
					t.Fatalf("%s: settle by token elsewhere = %+v, %v; want 60 back, 960 left", subject, d, err)
				}
				if n, _ := a.Exists(ctx, record).Result(); n != 0 {
					t.Fatalf("%s: the record outlived its settle", subject)
				}
				if _, err := here.Settle(ctx, rv.Token(), 40); !errors.Is(err, ratelimit.ErrNotReserved) {
					t.Fatalf("%s: a second settle: %v; want ErrNotReserved", subject, err)
				}
			}
			if len(seen) != 3 {
				t.Fatalf("the subjects' buckets were on %d masters, want 3", len(seen))
			}
			evalsha := 0
			for _, m := range masters {
				evalsha += commandCalls(t, m, "evalsha")
			}
			if (evalsha > 0) != tc.scripts {
				t.Fatalf("the masters ran EVALSHA %d times", evalsha)
			}
		})
	}
}

// TestSettleFindsOnlyItsBucketsRecord: the script settles a record only on
// the bucket it names: a settle of its id on another bucket, or by token in
// another namespace, finds nothing and leaves the record; by token in the
// record's namespace, or with the empty prefix, it settles. A record that is
// not one is an error.
func TestSettleFindsOnlyItsBucketsRecord(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	store := redisstore.New(client)
	l, _ := ratelimit.New[string](store, ratelimit.PerHour(1000), ratelimit.WithNamespace("own"))
	r := ratelimit.Request{Limits: l.Limits()}
	for _, tc := range []struct {
		name, key string
		found     bool
	}{
		{"another bucket", l.Key("other"), false},
		{"another namespace", keyfmt.Prefix("other"), false},
		{"a namespace that starts the same", keyfmt.Prefix("ow"), false},
		{"its namespace", keyfmt.Prefix("own"), true},
		{"its bucket", l.Key("tenant"), true},
		{"any namespace", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rv, err := l.Reserve(ctx, "tenant", time.Minute, 100)
			if err != nil || !rv.Decision.Allowed {
				t.Fatal(rv, err)
			}
			record := keyfmt.Record(l.Key("tenant"), rv.Token())
			d, err := store.Settle(ctx, tc.key, rv.Token(), r, []int64{0})
			n, _ := client.Exists(ctx, record).Result()
			if tc.found {
				if err != nil || d.Remaining != 1000 || n != 0 {
					t.Fatalf("settle = %+v, %v; the record left: %d; want 1000 and no record", d, err, n)
				}
				return
			}
			if !errors.Is(err, ratelimit.ErrNotReserved) || n != 1 {
				t.Fatalf("settle = %+v, %v; the record left: %d; want ErrNotReserved and the record", d, err, n)
			}
			if keyfmt.IsPrefix(tc.key) && !reflect.DeepEqual(d, (ratelimit.Decision{})) {
				t.Fatalf("settle by token in another namespace = %+v; want a zero Decision", d)
			}
			if err := rv.Cancel(ctx); err != nil {
				t.Fatalf("its own cancel after: %v", err)
			}
		})
	}
	id := keyfmt.ReservationID(l.Key("tenant"))
	for _, bad := range []string{"\x01", "\x02\x01" + strings.Repeat("\x00", 28), "\x02\x09" + strings.Repeat("\x00", 40)} {
		client.Set(ctx, keyfmt.Record(l.Key("tenant"), id), bad, time.Minute)
		if _, err := store.Settle(ctx, keyfmt.Prefix("own"), id, r, []int64{0}); !errors.Is(err, tokenbucket.ErrCorruptState) {
			t.Errorf("settle of record %q: %v; want ErrCorruptState", bad, err)
		}
	}
}
