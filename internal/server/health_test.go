package server

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/exactlimit/ratelimit/fallback"
)

func TestReadyz(t *testing.T) {
	down := false
	var mu sync.Mutex
	degraded := func() bool { mu.Lock(); defer mu.Unlock(); return down }
	setDown := func(v bool) { mu.Lock(); down = v; mu.Unlock() }
	for _, tt := range []struct {
		outage    fallback.Outage
		readyDown bool
	}{
		{fallback.FailClosed, false}, {fallback.ReturnError, false},
		{fallback.FailOpen, true}, {fallback.LocalFallback, true},
	} {
		t.Run(tt.outage.String(), func(t *testing.T) {
			setDown(false)
			s, _, _ := newService(t, Options{Outage: tt.outage, Degraded: degraded})
			h := s.Handler()
			if res := call(t, h, "GET", "/readyz", ""); res.code != 200 {
				t.Errorf("store up: /readyz %d", res.code)
			}
			setDown(true)
			if res := call(t, h, "GET", "/readyz", ""); (res.code == 200) != tt.readyDown {
				t.Errorf("store down: /readyz %d %s", res.code, res.body)
			}
			if res := call(t, h, "GET", "/healthz", ""); res.code != 200 {
				t.Errorf("store down: /healthz (liveness) %d", res.code)
			}
			setDown(false)
			s.Drain()
			if res := call(t, h, "GET", "/readyz", ""); res.code != 503 || !strings.Contains(res.body, "shutting down") {
				t.Errorf("draining: /readyz %d %s", res.code, res.body)
			}
			if res := call(t, h, "GET", "/healthz", ""); res.code != 200 {
				t.Errorf("draining: /healthz (liveness) %d", res.code)
			}
		})
	}
	// With Ping, readiness asks the store, whether a check has found it
	// down or not.
	var pingErr error
	s, _, _ := newService(t, Options{Outage: fallback.FailClosed, Degraded: func() bool { return false },
		Ping: func(context.Context) error { mu.Lock(); defer mu.Unlock(); return pingErr }})
	if res := call(t, s.Handler(), "GET", "/readyz", ""); res.code != 200 {
		t.Errorf("ping answers: /readyz %d", res.code)
	}
	mu.Lock()
	pingErr = errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	mu.Unlock()
	if res := call(t, s.Handler(), "GET", "/readyz", ""); res.code != 503 || !strings.Contains(res.body, "connection refused") {
		t.Errorf("ping fails: /readyz %d %s", res.code, res.body)
	}
}
