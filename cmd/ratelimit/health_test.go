package main_test

import (
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/internal/redistest"
)

func TestServeReadyz(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	url := "redis://" + srv.Addr()
	closed := serve(t, nil, "--redis", url, "--timeout", "300ms")
	open := serve(t, nil, "--redis", url, "--timeout", "300ms", "--outage", "local-fallback")
	for _, p := range []*proc{closed, open} {
		if r := get(t, "http://"+p.addr+"/readyz"); r.code != 200 {
			t.Errorf("Redis up: /readyz %d %s", r.code, r.raw)
		}
	}
	srv.Kill()
	waitCode := func(p *proc, path string, want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			post(t, p.addr, "/v1/acquire", `{"subject":"r"}`) // lets a check find the outage too
			r := get(t, "http://"+p.addr+path)
			if r.code == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d %s, want %d", path, r.code, r.raw, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Not ready before any check found the outage: /readyz asks Redis.
	if r := get(t, "http://"+closed.addr+"/readyz"); r.code != 503 {
		t.Errorf("Redis down, no check yet: /readyz %d %s", r.code, r.raw)
	}
	waitCode(closed, "/readyz", 503)
	closed.waitLog(t, "redis unreachable")
	waitCode(closed, "/healthz", 200)
	post(t, open.addr, "/v1/acquire", `{"subject":"r"}`)
	open.waitLog(t, "redis unreachable")
	waitCode(open, "/readyz", 200)
	closed.stop(t)
	open.stop(t)
}
