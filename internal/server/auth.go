package server

import (
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"
)

// authorized reports whether r may use /v1/: with the token, when there
// is one.
func (s *Service) authorized(r *http.Request) bool { return s.access.Authorized(r) }

// metricsAuthorized reports whether r may read /metrics: with the metrics
// token (SetMetricsToken) or the API's, when either is set.
func (s *Service) metricsAuthorized(r *http.Request) bool { return s.access.MetricsAuthorized(r) }

// SetToken replaces the bearer token /v1/ requires ("" for none), as the
// command does when SIGHUP re-reads --token-file. Requests already
// authorized are not affected.
func (s *Service) SetToken(token string) { s.access.SetToken(token) }

// SetMetricsToken replaces the bearer token /metrics accepts besides the
// API's ("" for none), as the command does when SIGHUP re-reads
// --metrics-token-file.
func (s *Service) SetMetricsToken(token string) { s.access.SetMetricsToken(token) }

// unauthorized answers 401 and logs the refusal, at most one line a second
// with the count of those dropped; the token sent is never logged.
func (s *Service) unauthorized(w http.ResponseWriter, r *http.Request, path string) {
	reason := "no bearer token"
	if r.Header.Get("Authorization") != "" {
		reason = "wrong bearer token"
	}
	s.authLog.log(s.log, "refused a request to the API", "path", path, "remote", r.RemoteAddr, "reason", reason)
	w.Header().Set("WWW-Authenticate", `Bearer realm="ratelimit"`)
	s.fail(w, path, http.StatusUnauthorized, "missing or wrong bearer token")
}

// rateLimitedLog logs at most one line a second, counting the lines it
// dropped, so that an outage does not flood the log.
type rateLimitedLog struct {
	last    atomic.Int64
	dropped atomic.Int64
}

func (l *rateLimitedLog) log(lg *slog.Logger, msg string, args ...any) {
	now := time.Now().UnixNano()
	last := l.last.Load()
	if now-last < int64(time.Second) || !l.last.CompareAndSwap(last, now) {
		l.dropped.Add(1)
		return
	}
	if n := l.dropped.Swap(0); n > 0 {
		args = append(args, "similar_lines_dropped", n)
	}
	lg.Warn(msg, args...)
}
