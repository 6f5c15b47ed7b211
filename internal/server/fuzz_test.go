package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/memstore"
)

// FuzzAPIRequest sends any body to each POST endpoint of the service: the
// answer is a decision (200 or 429), a deletion (200) or a client error
// (4xx) with a JSON body, never a 5xx and never a panic. The seed corpus is
// in testdata/fuzz/FuzzAPIRequest.
func FuzzAPIRequest(f *testing.F) {
	f.Add(`{"namespace": "default", "subject": "alice", "cost": 1}`, uint8(0))
	f.Add(`{"subject": "\xff"}`, uint8(1))
	f.Add(`{"subject": "a", "cost": 1e400}`, uint8(2))
	s, err := New(Options{Store: memstore.New(), Policies: config.Default()})
	if err != nil {
		f.Fatal(err)
	}
	h := s.Handler()
	paths := []string{"/v1/acquire", "/v1/peek", "/v1/reset"}
	f.Fuzz(func(t *testing.T, body string, which uint8) {
		path := paths[int(which)%len(paths)]
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code >= 500 || w.Code < 200 {
			t.Fatalf("POST %s %q: %d %s", path, body, w.Code, w.Body.String())
		}
		if !strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") {
			t.Fatalf("POST %s %q: %d with Content-Type %q", path, body, w.Code, w.Header().Get("Content-Type"))
		}
	})
}
