package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/storetest"
	"github.com/exactlimit/ratelimit/redisstore"
)

func TestApplyBatch(t *testing.T) {
	srv, admin := standalone(t)
	ctx := context.Background()
	client, hook := hookedClient(t, srv)
	store := redisstore.New(client)
	l, _ := ratelimit.New[string](store, ratelimit.PerMinute(2), ratelimit.WithClock(func() time.Time { return storetest.Start }))
	item := func(subject string, cost int64) ratelimit.BatchItem {
		key, r, _ := l.Request(subject, 1)
		r.Cost = cost
		return ratelimit.BatchItem{Key: key, Request: r}
	}
	admin.ScriptFlush(ctx)
	items := []ratelimit.BatchItem{item("a", 1), item("b", 2), item("a", 1), item("c", 3), item("a", 1)}
	store.ApplyBatch(ctx, items)
	want := []struct {
		allowed bool
		remain  int64
		invalid bool
	}{{true, 1, false}, {true, 0, false}, {true, 0, false}, {false, 0, true}, {false, 0, false}}
	for i, w := range want {
		it := items[i]
		if w.invalid {
			if !errors.Is(it.Err, ratelimit.ErrInvalidArgument) {
				t.Errorf("item %d: err = %v, want ErrInvalidArgument", i, it.Err)
			}
			continue
		}
		if it.Err != nil || it.Decision.Allowed != w.allowed || it.Decision.Remaining != w.remain {
			t.Errorf("item %d = %+v, %v; want allowed=%v remaining=%d", i, it.Decision, it.Err, w.allowed, w.remain)
		}
	}
	// One pipeline of EVALSHA, one of EVAL after SCRIPT FLUSH; nothing else.
	var pipes []string
	for _, p := range hook.pipes {
		if !strings.HasPrefix(p, "client") && !strings.HasPrefix(p, "hello") { // a new connection's handshake
			pipes = append(pipes, p)
		}
	}
	if got := strings.Join(pipes, " | "); got != "evalsha evalsha evalsha evalsha | eval eval eval eval" {
		t.Errorf("pipelines sent: %q", got)
	}
}

func TestCoalescingSendsConcurrentChecksTogether(t *testing.T) {
	srv, _ := standalone(t)
	ctx := context.Background()
	client, hook := hookedClient(t, srv)
	l, _ := ratelimit.NewEncoded(redisstore.New(client), strconv.Itoa, []ratelimit.Limit{ratelimit.PerHour(300)}, ratelimit.WithClock(func() time.Time { return storetest.Start }))
	var admitted atomic.Int64
	var wg sync.WaitGroup
	const workers, each = 32, 40
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				d, err := l.TryAcquire(ctx, (w*each+i)%3) // three hot subjects
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 3*300 {
		t.Fatalf("admitted %d of %d checks on 3 subjects of 300, want exactly 900", got, workers*each)
	}
	hook.mu.Lock()
	trips := len(hook.names) + len(hook.pipes)
	hook.mu.Unlock()
	if trips >= workers*each {
		t.Fatalf("%d checks took %d round trips; concurrent checks were not coalesced", workers*each, trips)
	}
	t.Logf("%d checks from %d goroutines took %d round trips", workers*each, workers, trips)
}

func TestCoalescedCheckHonoursItsDeadline(t *testing.T) {
	srv, client := standalone(t)
	ctx := context.Background()
	l, _ := ratelimit.New[string](redisstore.New(client), ratelimit.PerSecond(10))
	if _, err := l.TryAcquire(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	defer srv.Cont()
	// The first check hangs on the stopped server; the second queues behind
	// it and must give up at its own deadline.
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := l.TryAcquire(ctx, "a")
		first <- err
	}()
	time.Sleep(50 * time.Millisecond)
	ctx2, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.TryAcquire(ctx2, "b")
	if took := time.Since(start); err == nil || took > time.Second {
		t.Fatalf("queued check on a hung server: err %v after %v; want an error at its 200ms deadline", err, took)
	}
	srv.Cont()
	if err := <-first; err == nil {
		t.Log("the first check completed after SIGCONT")
	}
}

func TestBatchOnClusterWithAMasterDown(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	client := redistest.NewClusterClient(cluster.Addrs()...)
	defer client.Close()
	store := redisstore.New(client)
	l, _ := ratelimit.New[string](store, ratelimit.PerMinute(5), ratelimit.WithClock(func() time.Time { return storetest.Start }))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var items []ratelimit.BatchItem
	for i := range 60 {
		key, r, _ := l.Request(fmt.Sprint("s", i), 1)
		items = append(items, ratelimit.BatchItem{Key: key, Request: r})
	}
	store.ApplyBatch(ctx, items)
	for i, it := range items {
		if it.Err != nil || !it.Decision.Allowed {
			t.Fatalf("item %d with every master up: %+v %v", i, it.Decision, it.Err)
		}
	}
	dead := cluster.Masters()[0]
	owner := make([]string, len(items))
	for i, it := range items {
		owner[i] = cluster.MasterOf(redistest.SlotOf(it.Key)).Addr()
	}
	dead.Kill()
	store.ApplyBatch(ctx, items)
	var onDead, decided int
	for i, it := range items {
		if owner[i] == dead.Addr() {
			onDead++
			if it.Err == nil {
				t.Errorf("item %d on the dead master was decided: %+v", i, it.Decision)
			}
			continue
		}
		if it.Err != nil || !it.Decision.Allowed || it.Decision.Remaining != 3 {
			t.Errorf("item %d on a live master = %+v, %v; want allowed with 3 left", i, it.Decision, it.Err)
		}
		decided++
	}
	if onDead == 0 || decided == 0 {
		t.Fatalf("%d items on the dead master, %d on live ones; want some of each", onDead, decided)
	}
}
