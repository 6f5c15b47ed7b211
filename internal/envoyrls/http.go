package envoyrls

import (
	"errors"
	"io"
	"net/http"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// HTTP serves the peer's HTTP endpoints of the service:
//
//	POST /json        a RateLimitRequest in protobuf's JSON mapping; the
//	                  RateLimitResponse in the same form, 200 when OK, 429
//	                  when OVER_LIMIT, 400 for a request that is not valid,
//	                  503 when the store cannot decide; behind the guard
//	                  given to NewHTTP
//	GET /healthcheck  200 "OK" while serving, 500 once Shutdown is called
//
// Any other path is passed to next. HTTP is safe for simultaneous use.
type HTTP struct {
	svc  *Service
	json http.Handler // POST /json, behind the guard
	next http.Handler
	down atomic.Bool
}

// NewHTTP returns the endpoints of svc in front of next. POST /json spends
// the rules' buckets, and refunds them with is_negative_hits, so it is served
// through guard: the checks of the HTTP service it is mounted in (the
// command's is server.Service.Guard, with the API's token, Host check and
// JSON Content-Type). A nil guard serves it unchecked. GET /healthcheck,
// which tells nothing and changes nothing, needs no guard: Envoy's and
// Kubernetes' health checks call it with a Host of their own.
func NewHTTP(svc *Service, next http.Handler, guard func(path string, h http.Handler) http.Handler) *HTTP {
	h := &HTTP{svc: svc, next: next}
	h.json = http.HandlerFunc(h.serveJSON)
	if guard != nil {
		h.json = guard("/json", h.json)
	}
	return h
}

// Shutdown makes /healthcheck answer 500, for the time a graceful stop
// takes.
func (h *HTTP) Shutdown() { h.down.Store(true) }

// ServeHTTP implements http.Handler.
func (h *HTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/json":
		h.json.ServeHTTP(w, r)
	case "/healthcheck":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if h.down.Load() {
			http.Error(w, "shutting down", http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "OK") //nolint:errcheck // the client's loss
	default:
		h.next.ServeHTTP(w, r)
	}
}

func (h *HTTP) serveJSON(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRecvMsgSize))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, "not a RateLimitRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := h.svc.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		code := http.StatusBadRequest
		switch status.Code(err) {
		case codes.Unavailable:
			code = http.StatusServiceUnavailable
		case codes.Canceled:
			return
		}
		http.Error(w, status.Convert(err).Message(), code)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, "encoding the response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out) //nolint:errcheck // the client's loss
}
