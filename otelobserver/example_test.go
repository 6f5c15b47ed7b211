package otelobserver_test

import (
	"context"
	"fmt"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/otelobserver"
	"go.opentelemetry.io/otel/metric/noop"
)

func Example() {
	// In a program: otel.GetMeterProvider().Meter("github.com/exactlimit/ratelimit"),
	// with the SDK and an exporter set up.
	meter := noop.NewMeterProvider().Meter("github.com/exactlimit/ratelimit")
	obs, err := otelobserver.New(meter)
	if err != nil {
		panic(err)
	}
	limiter, _ := ratelimit.New[string](memstore.New(), ratelimit.PerSecond(100),
		ratelimit.WithNamespace("api"), ratelimit.WithObserver(obs))
	d, _ := limiter.TryAcquire(context.Background(), "user:42")
	fmt.Println(d.Allowed)
	// Output: true
}
