package server

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/operator"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// newStatsService is newService with Stats of options so on the Service's
// test clock.
func newStatsService(t *testing.T, o Options, so operator.StatsOptions) (*Service, *testkit.Clock) {
	t.Helper()
	c := testkit.NewClock(t0)
	so.Clock = c.Now
	o.Stats = operator.NewStats(so)
	o.Clock = c.Now
	o.Store = memstore.New(memstore.WithClock(c.Now))
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func nsReport(t *testing.T, r operator.Report, name string) operator.NamespaceReport {
	t.Helper()
	for _, ns := range r.Namespaces {
		if ns.Name == name {
			return ns
		}
	}
	t.Fatalf("namespace %q not in the report %+v", name, r.Namespaces)
	return operator.NamespaceReport{}
}

func TestStatsStoreAndReload(t *testing.T) {
	down := errors.New("dial tcp 127.0.0.1:6379: connection refused")
	degraded := false
	s, c, _ := newService(t, Options{
		StoreName: "redis cluster 127.0.0.1:7000", StoreKind: operator.StoreCluster, Outage: fallback.LocalFallback,
		Degraded: func() bool { return degraded },
		Masters:  func(context.Context) ([]string, error) { return []string{"127.0.0.1:7001", "127.0.0.1:7000"}, nil },
	})
	ctx := context.Background()
	r := s.Stats(ctx)
	if !r.Store.PrimaryUp || r.Store.Kind != operator.StoreCluster || r.Store.Outage != "local-fallback" || len(r.Store.Masters) != 2 ||
		r.Store.Masters[0] != (operator.MasterReport{Addr: "127.0.0.1:7000", Up: true}) || r.Reload != nil {
		t.Errorf("at start: %+v, reload %+v", r.Store, r.Reload)
	}

	c.Add(time.Second)
	s.stats.ObserveFallback(ctx, fallback.Event{Partition: "127.0.0.1:7001", Outage: fallback.LocalFallback, Cause: down, At: c.Now()})
	s.stats.ObserveFallback(ctx, fallback.Event{Partition: "127.0.0.1:7002", Alive: true, Outage: fallback.LocalFallback, At: c.Now()})
	degraded = true
	r = s.Stats(ctx)
	if r.Store.PrimaryUp || len(r.Store.Masters) != 3 {
		t.Fatalf("one master down: %+v", r.Store)
	}
	m := r.Store.Masters[1]
	if m.Addr != "127.0.0.1:7001" || m.Up || m.Error != down.Error() || m.Since == nil || !m.Since.Equal(c.Now()) {
		t.Errorf("the master down: %+v", m)
	}
	if m := r.Store.Masters[2]; m.Addr != "127.0.0.1:7002" || !m.Up || r.Store.Outages != 1 {
		t.Errorf("a master known only from an event: %+v; outages ended %d", m, r.Store.Outages)
	}

	dir := t.TempDir()
	bad := dir + "/bad.yaml"
	testkit.WriteFile(t, bad, "namespaces: [")
	if err := s.Reload(bad); err == nil {
		t.Fatal("a bad file was accepted")
	}
	r = s.Stats(ctx)
	if r.Reload == nil || r.Reload.Result != "refused" || r.Reload.File != bad || r.Reload.Error == "" || !r.Reload.At.Equal(c.Now()) {
		t.Errorf("after a refused reload: %+v", r.Reload)
	}
	good := dir + "/good.yaml"
	testkit.WriteFile(t, good, "namespaces:\n  - name: login\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	c.Add(time.Second)
	if err := s.Reload(good); err != nil {
		t.Fatal(err)
	}
	r = s.Stats(ctx)
	if r.Reload == nil || r.Reload.Result != "ok" || r.Reload.Error != "" || !r.Reload.At.Equal(c.Now()) {
		t.Errorf("after a good reload: %+v", r.Reload)
	}
	if len(r.Namespaces) != 2 || r.Namespaces[1].Name != "login" || !reflect.DeepEqual(r.Namespaces[1].Policy, config.PolicyJSON{Capacity: 5, RefillTokens: 5, RefillPeriod: "1m"}) {
		t.Errorf("namespaces after the reload: %+v", r.Namespaces)
	}
}

func TestStatsSingleServerOutage(t *testing.T) {
	s, c, _ := newService(t, Options{StoreKind: operator.StoreRedis, Outage: fallback.FailClosed})
	ctx := context.Background()
	s.stats.ObserveFallback(ctx, fallback.Event{Outage: fallback.FailClosed, Cause: errors.New("EOF"), At: c.Now()})
	r := s.Stats(ctx).Store
	if r.Since == nil || !r.Since.Equal(c.Now()) || r.Error != "EOF" || len(r.Masters) != 0 || r.Outage != "fail-closed" {
		t.Errorf("single server down: %+v", r)
	}
}

func TestStatsEmbeddedHasNoOutage(t *testing.T) {
	s, _, _ := newService(t, Options{StoreKind: operator.StoreEmbedded, Outage: fallback.FailClosed})
	if r := s.Stats(context.Background()).Store; r.Outage != "" || !r.PrimaryUp {
		t.Errorf("embedded store: %+v", r)
	}
}
