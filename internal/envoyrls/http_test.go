package envoyrls

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHTTPEndpoints(t *testing.T) {
	f := serveWith(t, Options{})
	h := NewHTTP(f.svc, http.NotFoundHandler(), nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	post := func(body string) (int, string) {
		t.Helper()
		resp, err := http.Post(srv.URL+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	req := `{"domain": "edge", "descriptors": [{"entries": [{"key": "one", "value": "x"}]}]}`
	code, body := post(req)
	if code != http.StatusOK || !strings.Contains(body, `"overallCode":"OK"`) {
		t.Errorf("first: %d %s", code, body)
	}
	code, body = post(req)
	if code != http.StatusTooManyRequests || !strings.Contains(body, `"overallCode":"OVER_LIMIT"`) {
		t.Errorf("second: %d %s, want 429 OVER_LIMIT", code, body)
	}
	for _, bad := range []string{`{"domain": ""}`, `not json`, `{"domain": "edge", "descriptors": [{"entries": []}]}`} {
		if code, body := post(bad); code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", bad, code, body)
		}
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthcheck"); code != http.StatusOK || body != "OK" {
		t.Errorf("/healthcheck: %d %q", code, body)
	}
	if code, _ := get("/json"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /json: %d, want 405", code)
	}
	if code, _ := get("/other"); code != http.StatusNotFound {
		t.Errorf("/other: %d, want the next handler's 404", code)
	}
	h.Shutdown()
	if code, _ := get("/healthcheck"); code != http.StatusInternalServerError {
		t.Errorf("/healthcheck while shutting down: %d, want 500", code)
	}
}
