package server

import (
	"context"
	"net/http"

	"github.com/exactlimit/ratelimit/internal/operator"
)

// Stats returns the operator page's figures of the service, as
// GET /v1/stats serves them.
func (s *Service) Stats(ctx context.Context) operator.Report {
	store := operator.StoreReport{Kind: s.kind, Name: s.name, PrimaryUp: !s.degraded()}
	if s.kind != operator.StoreEmbedded {
		store.Outage = s.outage.String()
	}
	return s.stats.Report(ctx, operator.Source{
		Namespaces: s.policies.Load().limits, Store: store, Masters: s.masters, Envoy: s.envoy,
	})
}

// serveStats answers GET /v1/stats, behind the API's token.
func (s *Service) serveStats(w http.ResponseWriter, r *http.Request) {
	const path = "/v1/stats"
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		s.fail(w, path, http.StatusMethodNotAllowed, "/v1/stats wants GET")
		return
	}
	if !s.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="ratelimit"`)
		s.fail(w, path, http.StatusUnauthorized, "missing or wrong bearer token")
		return
	}
	s.reply(w, path, http.StatusOK, s.Stats(r.Context()))
}

// servePage answers GET / and the page's style and script (package
// operator), to anyone: they hold no figure.
func (s *Service) servePage(w http.ResponseWriter, r *http.Request) {
	a, ok := operator.PageAsset(r.URL.Path)
	if !ok {
		s.notFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		s.fail(w, r.URL.Path, http.StatusMethodNotAllowed, r.URL.Path+" wants GET")
		return
	}
	s.metrics.requests.WithLabelValues(r.URL.Path, "200").Inc()
	a.Write(w, r.Method == http.MethodHead)
}

// notFound answers a path the service does not serve.
func (s *Service) notFound(w http.ResponseWriter, r *http.Request) {
	s.fail(w, "/", http.StatusNotFound, "no such endpoint "+r.URL.Path+
		"; the API is POST /v1/acquire, /v1/peek, /v1/reset, /v1/reserve, /v1/settle, GET /v1/stats, /v1/config, /healthz, /readyz, /metrics, its description GET /openapi.json, and the operator page GET /")
}
