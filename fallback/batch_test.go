package fallback

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/exactlimit/ratelimit"
)

// batchPrimary is a partitionedPrimary that decides batches, counting the
// batches and the items it is sent.
type batchPrimary struct {
	*partitionedPrimary
	batches, sent atomic.Int64
}

func (b *batchPrimary) ApplyBatch(ctx context.Context, items []ratelimit.BatchItem) {
	b.batches.Add(1)
	b.sent.Add(int64(len(items)))
	for i := range items {
		items[i].Decision, items[i].Err = b.Apply(ctx, items[i].Key, items[i].Request)
	}
}

// ApplyAll completes the BatchStore; this file's tests do not call it.
func (b *batchPrimary) ApplyAll(context.Context, []ratelimit.BatchItem) error {
	return errors.New("batchPrimary: ApplyAll is not used here")
}

func TestApplyBatch(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	var dead atomic.Value
	dead.Store("")
	prim := &batchPrimary{partitionedPrimary: &partitionedPrimary{fakePrimary: newFakePrimary(clk.Now), dead: &dead}}
	partOf := func(_ context.Context, key string) string { return key[:1] }
	ping := func(_ context.Context, part string) error {
		if part == dead.Load().(string) {
			return refusedError()
		}
		return nil
	}
	s := mustNew(t, prim, WithOutage(LocalFallback), WithClock(clk.Now), withPartitions(partOf, ping))
	batch := func() []ratelimit.BatchItem {
		return []ratelimit.BatchItem{
			{Key: "a1", Request: req(perMinute100, 1, clk.Now())},
			{Key: "b1", Request: req(perMinute100, 1, clk.Now())},
			{Key: "a1", Request: req(perMinute100, 2, clk.Now())},
			{Key: "b2", Request: req(perMinute100, 0, clk.Now())}, // invalid
		}
	}
	items := batch()
	s.ApplyBatch(ctx, items)
	for i, it := range items[:3] {
		if it.Err != nil || it.Decision.Source != ratelimit.SourceStore {
			t.Fatalf("all alive: item %d = %+v, %v; want the primary's decision", i, it.Decision, it.Err)
		}
	}
	if items[2].Decision.Remaining != 97 {
		t.Errorf("the second item on a1 left %d, want 97: items on a key are decided in order", items[2].Decision.Remaining)
	}
	if !errors.Is(items[3].Err, ratelimit.ErrInvalidArgument) || prim.batches.Load() != 1 || prim.sent.Load() != 3 {
		t.Fatalf("invalid item: %v; batches %d, items sent %d; want ErrInvalidArgument, 1 batch of 3", items[3].Err, prim.batches.Load(), prim.sent.Load())
	}

	dead.Store("a")
	items = batch()
	s.ApplyBatch(ctx, items)
	if items[0].Err != nil || items[0].Decision.Source != ratelimit.SourceLocal || items[2].Decision.Source != ratelimit.SourceLocal {
		t.Fatalf("partition a refused: %+v, %+v; want local decisions", items[0], items[2])
	}
	if items[1].Err != nil || items[1].Decision.Source != ratelimit.SourceStore {
		t.Fatalf("partition b alive: %+v; want the primary's decision", items[1])
	}
	if items[2].Decision.Remaining != 97 {
		t.Errorf("local decisions on a1 out of order: second left %d, want 97", items[2].Decision.Remaining)
	}

	sentBefore := prim.sent.Load()
	items = batch()
	s.ApplyBatch(ctx, items)
	if got := prim.sent.Load() - sentBefore; got != 1 {
		t.Errorf("with partition a down, %d items were sent, want 1 (b1)", got)
	}
	if items[0].Decision.Source != ratelimit.SourceLocal || items[1].Decision.Source != ratelimit.SourceStore {
		t.Errorf("with partition a down: %+v, %+v", items[0], items[1])
	}

	done, cancel := context.WithCancel(ctx)
	cancel()
	items = batch()
	s.ApplyBatch(done, items)
	if !errors.Is(items[0].Err, context.Canceled) || !errors.Is(items[3].Err, ratelimit.ErrInvalidArgument) {
		t.Errorf("a done context: %v, %v; want context.Canceled and the validation error", items[0].Err, items[3].Err)
	}
}

func TestApplyBatchWithoutABatchPrimary(t *testing.T) {
	clk := newFakeClock()
	p := newFakePrimary(clk.Now)
	s := mustNew(t, p, WithOutage(FailClosed), WithClock(clk.Now))
	items := []ratelimit.BatchItem{
		{Key: "k", Request: req(perMinute100, 1, clk.Now())},
		{Key: "k", Request: req(perMinute100, 1, clk.Now())},
	}
	s.ApplyBatch(context.Background(), items)
	if items[0].Err != nil || items[1].Decision.Remaining != 98 || p.calls.Load() != 2 {
		t.Fatalf("= %+v; primary calls %d; want two decisions through Apply", items, p.calls.Load())
	}
	p.set(refused)
	s.ApplyBatch(context.Background(), items)
	if items[0].Decision.Source != ratelimit.SourceFailClosed || items[1].Decision.Source != ratelimit.SourceFailClosed || p.calls.Load() != 3 {
		t.Fatalf("= %+v; primary calls %d; want fail-closed answers after one refused call", items, p.calls.Load())
	}
}
