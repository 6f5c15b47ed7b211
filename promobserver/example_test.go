package promobserver_test

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/promobserver"
	"github.com/prometheus/client_golang/prometheus"
)

func Example() {
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer, served by promhttp.Handler
	obs := promobserver.New()
	reg.MustRegister(obs)

	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	limiter, _ := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(2),
		ratelimit.WithNamespace("login"), ratelimit.WithClock(func() time.Time { return now }),
		ratelimit.WithObserver(obs), ratelimit.WithDenyCache(1000))
	reg.MustRegister(promobserver.NewDenyCacheCollector("login", limiter.DenyCacheStats))
	for range 4 {
		limiter.TryAcquire(context.Background(), "alice")
	}

	families, _ := reg.Gather()
	for _, f := range families {
		for _, m := range f.GetMetric() {
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			if v == 0 {
				continue
			}
			labels := ""
			for _, l := range m.GetLabel() {
				if l.GetName() != "namespace" {
					labels += " " + l.GetName() + "=" + l.GetValue()
				}
			}
			fmt.Printf("%s%s %v\n", f.GetName(), labels, v)
		}
	}
	// Output:
	// ratelimit_decisions_total op=acquire result=allowed source=store 2
	// ratelimit_decisions_total op=acquire result=denied source=cache 1
	// ratelimit_decisions_total op=acquire result=denied source=store 1
	// ratelimit_deny_cache_capacity 1000
	// ratelimit_deny_cache_entries 1
	// ratelimit_deny_cache_hits_total 1
	// ratelimit_deny_cache_misses_total 3
	// ratelimit_tokens_total result=allowed 2
	// ratelimit_tokens_total result=denied 2
}
