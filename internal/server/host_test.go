package server

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// sendHost sends a POST /v1/reset to the real server at addr with the
// given Host header, and returns the status and the JSON error, if any.
func sendHost(t *testing.T, addr, host string, hdr ...string) (int, string) {
	t.Helper()
	code, b := post(t, "http://"+addr, "/v1/reset", "application/json", `{"subject":"alice"}`, append([]string{"Host", host}, hdr...)...)
	var body struct{ Error string }
	if code != 200 {
		if err := json.Unmarshal([]byte(b), &body); err != nil || body.Error == "" {
			t.Fatalf("Host %q: %d with a body that is not a JSON error: %q", host, code, b)
		}
	}
	return code, body.Error
}

// TestHostCheckAgainstDNSRebinding checks that without a token the API of
// a loopback listener refuses a request whose Host is another name (a
// page of rebind.attacker.example whose name now points at 127.0.0.1), and
// answers its own address in every loopback form and the names allowed;
// with a token set, the token decides instead.
func TestHostCheckAgainstDNSRebinding(t *testing.T) {
	s, _, logs := newService(t, Options{})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().(*net.TCPAddr)
	if err := s.AllowHosts(addr, []string{"ratelimit.internal", "api.example.com:443"}); err != nil {
		t.Fatal(err)
	}
	port := srv.Listener.Addr().(*net.TCPAddr).AddrPort().Port()
	p := func(host string) string { return net.JoinHostPort(host, strconv.Itoa(int(port))) }
	for _, tc := range []struct {
		host string
		ok   bool
	}{
		{p("127.0.0.1"), true},
		{p("localhost"), true},
		{p("LOCALHOST"), true},
		{p("localhost."), true},
		{p("::1"), true},
		{"ratelimit.internal", true},
		{p("ratelimit.internal"), true},
		{"api.example.com:443", true},
		{"rebind.attacker.example", false},
		{p("rebind.attacker.example"), false},
		{"api.example.com", false},
		{"localhost", false}, // port 80, not the listener's
		{p("10.0.0.1"), false},
		{p("127.0.0.1.attacker.example"), false},
	} {
		code, msg := sendHost(t, srv.Listener.Addr().String(), tc.host)
		if tc.ok && code != 200 || !tc.ok && (code != http.StatusMisdirectedRequest || !strings.Contains(msg, "--allowed-host")) {
			t.Errorf("Host %q: %d %q, want allowed %v", tc.host, code, msg, tc.ok)
		}
	}
	if !strings.Contains(logs.String(), "host not allowed") {
		t.Errorf("the refusals are not logged:\n%s", logs.String())
	}
	res, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(b), `ratelimit_http_requests_total{code="421",path="/v1/reset"} 6`) {
		t.Errorf("the 6 refusals are not counted under their route: %d", res.StatusCode)
	}

	// With a token the Host is not checked: the token is what the page of
	// another site cannot send.
	s.SetToken("t0ken")
	if code, msg := sendHost(t, srv.Listener.Addr().String(), "rebind.attacker.example", "Authorization", "Bearer t0ken"); code != 200 {
		t.Errorf("with the token, another Host: %d %q", code, msg)
	}
	if code, _ := sendHost(t, srv.Listener.Addr().String(), "rebind.attacker.example"); code != 401 {
		t.Errorf("with a token set, another Host and no token: %d, want 401", code)
	}
}

// TestHostCheckAllAddresses checks the Host check of a listener on every
// address: an IP literal at its port is its own address (no name to
// rebind), a name is not unless allowed; and that bad names are refused.
func TestHostCheckAllAddresses(t *testing.T) {
	s, _, _ := newService(t, Options{})
	if err := s.AllowHosts(&net.TCPAddr{IP: net.IPv4zero, Port: 8080}, nil); err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	for _, tc := range []struct {
		host string
		code int
	}{
		{"10.1.2.3:8080", 200},
		{"[2001:db8::1]:8080", 200},
		{"localhost:8080", 200},
		{"10.1.2.3:9999", 421},
		{"rebind.attacker.example:8080", 421},
	} {
		r := httptest.NewRequest("POST", "/v1/peek", strings.NewReader(`{"subject":"a"}`))
		r.Host = tc.host
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.code {
			t.Errorf("Host %q: %d %s, want %d", tc.host, w.Code, w.Body, tc.code)
		}
	}
	for _, bad := range []string{"", "a b", "http://x", "x:0", "x:port", ":8080", "a:b:c"} {
		if err := s.AllowHosts(&net.TCPAddr{IP: net.IPv4zero, Port: 8080}, []string{bad}); err == nil {
			t.Errorf("AllowHosts(%q): no error", bad)
		}
	}
}
