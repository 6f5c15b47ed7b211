package server

import (
	"context"
	"net/http"

	"github.com/exactlimit/ratelimit/fallback"
)

func (s *Service) healthz(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		s.fail(w, "/healthz", http.StatusMethodNotAllowed, "/healthz wants GET")
		return
	}
	state := "primary"
	if s.degraded() {
		state = "outage: " + s.outage.String()
	}
	s.reply(w, "/healthz", http.StatusOK, map[string]any{
		"status":     "ok",
		"store":      s.name,
		"serving":    state,
		"namespaces": s.policies.Load().limits.Names(),
	})
}

// Drain marks the service as shutting down: /readyz answers 503 from then
// on, so that a load balancer stops sending requests, while the API keeps
// answering those that still come. /healthz (liveness) is not affected.
func (s *Service) Drain() { s.draining.Store(true) }

// Ready reports whether the service should receive traffic, and why not:
// not while draining, and not while its store is unreachable (Options.Ping
// fails, or without Ping, Degraded says so) unless the outage behaviour
// deliberately serves (fail-open, local-fallback).
func (s *Service) Ready(ctx context.Context) (bool, string) {
	if s.draining.Load() {
		return false, "shutting down"
	}
	if s.outage == fallback.FailOpen || s.outage == fallback.LocalFallback {
		return true, ""
	}
	if s.ping != nil {
		ctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		if err := s.ping(ctx); err != nil {
			return false, "store unreachable (" + RedactKeys(err.Error()) + "); outage behaviour " + s.outage.String() + " refuses checks"
		}
		return true, ""
	}
	if s.degraded() {
		return false, "store unreachable; outage behaviour " + s.outage.String() + " refuses checks"
	}
	return true, ""
}

// readyz is readiness: 200 when Ready, else 503 with the reason.
func (s *Service) readyz(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		s.fail(w, "/readyz", http.StatusMethodNotAllowed, "/readyz wants GET")
		return
	}
	if ok, why := s.Ready(r.Context()); !ok {
		s.reply(w, "/readyz", http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": why})
		return
	}
	s.reply(w, "/readyz", http.StatusOK, map[string]string{"status": "ready"})
}
