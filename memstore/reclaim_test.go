package memstore

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// fill checks one subject in each of n namespaces, under one of p policies
// in turn.
func fill(t *testing.T, s *Store, n, p int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		ns := "tenant-" + strconv.Itoa(i)
		key := strconv.Itoa(len(ns)) + ":" + ns + ":user"
		r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(int64(10 + i%p))}, Cost: 1}
		if d, err := s.Apply(ctx, key, r); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v, %v", key, d, err)
		}
	}
}

// held returns the spaces, policy references and policies the store holds.
func (s *Store) held() (spaces, refs, policies int) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		spaces += len(sh.spaces)
		refs += len(sh.one) + len(sh.many)
		sh.mu.Unlock()
	}
	s.polMu.RLock()
	policies = len(s.policies)
	s.polMu.RUnlock()
	return spaces, refs, policies
}

func TestExpiredNamespacesAndPoliciesGiveTheirMemoryBack(t *testing.T) {
	const namespaces, policies = 100_000, 10_000
	clock := testkit.NewClock(testkit.Start)
	s := New(WithClock(clock.Now))
	before := testkit.LiveHeap()
	fill(t, s, namespaces, policies)
	full := testkit.LiveHeap()
	if spaces, _, pols := s.held(); spaces < namespaces || pols != policies {
		t.Fatalf("holding %d spaces and %d policies, want at least %d and %d", spaces, pols, namespaces, policies)
	}
	clock.Add(2 * time.Second)
	s.Sweep()
	after := testkit.LiveHeap()
	if spaces, refs, pols := s.held(); spaces != 0 || refs != 0 || pols != 0 || s.Len() != 0 {
		t.Fatalf("after Sweep: %d buckets, %d spaces, %d policy references and %d policies held, want none", s.Len(), spaces, refs, pols)
	}
	grown, kept := int64(full)-int64(before), int64(after)-int64(before)
	t.Logf("heap: %d B before, %d B with %d namespaces (%d B each), %d B after Sweep", before, full, namespaces, grown/namespaces, after)
	if grown < namespaces*100 {
		t.Fatalf("the heap grew by %d B for %d namespaces: the measurement does not see them", grown, namespaces)
	}
	if kept > grown/20 {
		t.Fatalf("the heap keeps %d B of the %d B the expired namespaces took, want at most 5%%", kept, grown)
	}
	runtime.KeepAlive(s)
}

func TestChecksSweepExpiredNamespacesOut(t *testing.T) {
	// Without Sweep, checks on one subject reclaim every other namespace:
	// no sweep walks empty namespaces, so the work per check stays bounded.
	const namespaces = 20_000
	clock := testkit.NewClock(testkit.Start)
	s := New(WithClock(clock.Now))
	fill(t, s, namespaces, 100)
	clock.Add(2 * time.Second)
	ctx := context.Background()
	r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(1e9)}, Cost: 1}
	for range 3 * namespaces {
		if _, err := s.Apply(ctx, "3:hot:s", r); err != nil {
			t.Fatal(err)
		}
	}
	if spaces, refs, pols := s.held(); spaces != 1 || refs != 1 || pols != 1 || s.Len() != 1 {
		t.Fatalf("after %d checks on one subject: %d buckets, %d spaces, %d policy references and %d policies held, want the hot one of each",
			3*namespaces, s.Len(), spaces, refs, pols)
	}
}

func TestAPolicyInUseElsewhereIsKept(t *testing.T) {
	// The last bucket of a policy in one shard goes; the policy stays for the
	// buckets of other shards, and is found again by value.
	clock := testkit.NewClock(testkit.Start)
	s := New(WithClock(clock.Now))
	ctx := context.Background()
	limit := ratelimit.PerHour(5)
	r := ratelimit.Request{Limits: []ratelimit.Limit{limit}, Cost: 1}
	for i := range 200 {
		s.Apply(ctx, "1:a:"+strconv.Itoa(i), r)
	}
	for i := range 199 {
		s.Reset(ctx, "1:a:"+strconv.Itoa(i))
	}
	if _, refs, pols := s.held(); refs != 1 || pols != 1 {
		t.Fatalf("%d references and %d policies held for one bucket, want 1 and 1", refs, pols)
	}
	if d, _ := s.Apply(ctx, "1:a:199", r); d.Remaining != 3 {
		t.Fatalf("the remaining bucket lost its state: %+v", d)
	}
	s.Reset(ctx, "1:a:199")
	if spaces, refs, pols := s.held(); spaces != 0 || refs != 0 || pols != 0 {
		t.Fatalf("after the last Reset: %d spaces, %d references, %d policies held, want none", spaces, refs, pols)
	}
}

func TestPoliciesNoBucketWasWrittenWithAreNotKept(t *testing.T) {
	// Peeks at missing buckets write nothing: their policies are dropped as
	// the index grows, and all of them by Sweep.
	s := New(WithClock(testkit.NewClock(testkit.Start).Now))
	ctx := context.Background()
	for i := range 10_000 {
		r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(int64(1 + i))}, Peek: true}
		if d, err := s.Apply(ctx, "1:a:"+strconv.Itoa(i), r); err != nil || !d.Allowed {
			t.Fatalf("peek %d: %+v, %v", i, d, err)
		}
	}
	if _, _, pols := s.held(); pols > 200 {
		t.Fatalf("%d policies held after 10,000 peeks with a policy each, want at most a few dozen", pols)
	}
	s.Sweep()
	if spaces, refs, pols := s.held(); spaces != 0 || refs != 0 || pols != 0 {
		t.Fatalf("after Sweep: %d spaces, %d references and %d policies held, want none", spaces, refs, pols)
	}
}
