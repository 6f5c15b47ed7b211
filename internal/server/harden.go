package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
)

// maxLoggedError bounds an error message in a log line.
const maxLoggedError = 300

// RedactKeys returns msg with every quoted bucket key in it (a Go-quoted
// "LEN:NAMESPACE:SUBJECT", as the stores' errors quote keys) replaced by the
// namespace and the subject's keyfmt.Hash, and cut to a few hundred bytes,
// for the log.
func RedactKeys(msg string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(msg, '"')
		if i < 0 {
			b.WriteString(msg)
			break
		}
		b.WriteString(msg[:i])
		q, err := strconv.QuotedPrefix(msg[i:])
		if err != nil {
			// An unterminated quote: it may be a key cut short.
			b.WriteString(`"…`)
			break
		}
		msg = msg[i+len(q):]
		key, _ := strconv.Unquote(q)
		if ns, subject, ok := keyfmt.Parse(key); ok {
			b.WriteString(strconv.Quote(ns + ":" + keyfmt.Hash(subject)))
			continue
		}
		b.WriteString(q)
	}
	out := b.String()
	if len(out) > maxLoggedError {
		cut := maxLoggedError
		for cut > 0 && !utf8.RuneStart(out[cut]) {
			cut--
		}
		out = out[:cut] + "…"
	}
	return out
}

// redactErr returns err's message for the log, with key (subject's key
// in namespace ns) and any quoted key replaced by the namespace and the
// subject's hash.
func redactErr(err error, key, ns, subject string) string {
	msg := RedactKeys(err.Error())
	if key != "" {
		msg = strings.ReplaceAll(msg, key, ns+":"+keyfmt.Hash(subject))
	}
	return msg
}

// isJSON reports whether the request's Content-Type is application/json,
// with or without parameters. Requiring it keeps a web page from making a
// browser post to the API (a form or a text/plain fetch needs no preflight;
// application/json does).
func isJSON(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == "application/json"
}

// apiFields are the field names of APIRequest, exactly as they must be
// spelled.
var apiFields = []string{"namespace", "subject", "cost"}

// fieldList writes fields as a list in words: "namespace, subject and cost".
func fieldList(fields []string) string {
	if len(fields) < 2 {
		return strings.Join(fields, "")
	}
	return strings.Join(fields[:len(fields)-1], ", ") + " and " + fields[len(fields)-1]
}

// strictFields checks a JSON object's top-level field names: each must be
// one of fields, spelled exactly (encoding/json would match "Subject" or
// "SUBJECT" too), and none may appear twice (encoding/json keeps the
// last). It returns nil for input that is not an object: the decoder
// reports that.
func strictFields(data []byte, fields []string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		name, ok := tok.(string)
		if !ok {
			return nil
		}
		switch {
		case seen[name]:
			return fmt.Errorf("field %q appears twice", name)
		case !slices.Contains(fields, name):
			return fmt.Errorf("unknown field %q (the fields are %s, in lower case)", name, fieldList(fields))
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

// readBody reads a request body of at most MaxBodyBytes, holding the top-level
// fields named in fields at most, or returns the status and message of why
// it cannot. The body must be valid UTF-8: JSON
// decoding turns every invalid byte into U+FFFD, and two subjects would
// share a bucket.
func readBody(w http.ResponseWriter, r *http.Request, fields []string) ([]byte, int, string) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", mbe.Limit)
	case err != nil:
		return nil, http.StatusBadRequest, "could not read the body"
	case !utf8.Valid(data):
		return nil, http.StatusBadRequest, "the body is not valid UTF-8"
	}
	if err := strictFields(data, fields); err != nil {
		return nil, http.StatusBadRequest, err.Error()
	}
	return data, 0, ""
}

// SetToken replaces the bearer token /v1/ requires ("" for none), as the
// command does when SIGHUP re-reads --token-file. Requests already
// authorized are not affected.
func (s *Service) SetToken(token string) {
	b := []byte(token)
	s.token.Store(&b)
}

// SetMetricsToken replaces the bearer token /metrics accepts besides the
// API's ("" for none), as the command does when SIGHUP re-reads
// --metrics-token-file.
func (s *Service) SetMetricsToken(token string) {
	b := []byte(token)
	s.metricsToken.Store(&b)
}

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

// serveConfig is GET /v1/config: the namespaces and limits in force, the
// store (without credentials), the check timeout and the outage behaviour.
// It needs the bearer token as the rest of /v1/ does.
func (s *Service) serveConfig(w http.ResponseWriter, r *http.Request) {
	const path = "/v1/config"
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		s.fail(w, path, http.StatusMethodNotAllowed, path+" wants GET")
		return
	}
	if !s.authorized(r) {
		s.unauthorized(w, r, path)
		return
	}
	set := s.policies.Load()
	ns := make(map[string]Policy, len(set.limits))
	for name, pol := range set.limits {
		ns[name] = namespacePolicy(pol)
	}
	out := map[string]any{
		"namespaces": ns,
		"store":      s.name,
		"timeout":    s.timeout.String(),
		"version":    s.version,
	}
	if s.hasOutage {
		out["outage"] = s.outage.String()
	}
	s.reply(w, path, http.StatusOK, out)
}

// removedNames returns the namespaces of old that next lacks, sorted.
func removedNames(old, next config.Policies) []string {
	var out []string
	for _, n := range old.Names() {
		if _, ok := next[n]; !ok {
			out = append(out, n)
		}
	}
	return out
}
