package access

import (
	"net"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestTokens(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		token, metrics, sent    string
		authorized, metricsOpen bool
	}{
		{"no token: everything open", "", "", "", true, true},
		{"the API's token, sent", "api", "", "Bearer api", true, true},
		{"the API's token, in any case of Bearer", "api", "", "bearer api", true, true},
		{"the API's token, not sent", "api", "", "", false, false},
		{"the API's token, a wrong one", "api", "", "Bearer apx", false, false},
		{"the API's token, a prefix of it", "api", "", "Bearer ap", false, false},
		{"the metrics token opens /metrics only", "api", "scrape", "Bearer scrape", false, true},
		{"the API's token opens /metrics too", "api", "scrape", "Bearer api", true, true},
		{"a metrics token alone closes /metrics only", "", "scrape", "", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Checker
			c.SetToken(tc.token)
			c.SetMetricsToken(tc.metrics)
			r := httptest.NewRequest("GET", "/", nil)
			if tc.sent != "" {
				r.Header.Set("Authorization", tc.sent)
			}
			if got := c.Authorized(r); got != tc.authorized {
				t.Errorf("Authorized = %v, want %v", got, tc.authorized)
			}
			if got := c.MetricsAuthorized(r); got != tc.metricsOpen {
				t.Errorf("MetricsAuthorized = %v, want %v", got, tc.metricsOpen)
			}
		})
	}
}

func TestMisdirected(t *testing.T) {
	loopback := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}
	every := &net.TCPAddr{IP: net.IPv4zero, Port: 8080}
	for _, tc := range []struct {
		listen  *net.TCPAddr
		names   []string
		host    string
		refused bool
	}{
		{loopback, nil, "127.0.0.1:8080", false},
		{loopback, nil, "localhost:8080", false},
		{loopback, nil, "LOCALHOST.:8080", false},
		{loopback, nil, "[::1]:8080", false},
		{loopback, nil, "", false}, // HTTP/1.0: no name to rebind
		{loopback, nil, "localhost:9999", true},
		{loopback, nil, "rebind.attacker.example:8080", true},
		{loopback, []string{"ratelimit.internal"}, "ratelimit.internal:443", false},
		{loopback, []string{"rl.example:8443"}, "rl.example:8443", false},
		{loopback, []string{"rl.example:8443"}, "rl.example:8080", true},
		{every, nil, "10.1.2.3:8080", false},
		{every, nil, "10.1.2.3:9090", true},
		{every, nil, "name.example:8080", true},
	} {
		var c Checker
		if err := c.AllowHosts(tc.listen, tc.names); err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest("POST", "/v1/reset", nil)
		r.Host = tc.host
		refused, allowed := c.Misdirected(r)
		if refused != tc.refused || refused && !strings.Contains(allowed, tc.listen.String()) {
			t.Errorf("listen %v names %v Host %q: refused %v (%q), want %v", tc.listen, tc.names, tc.host, refused, allowed, tc.refused)
		}
		c.SetToken("secret")
		if refused, _ := c.Misdirected(r); refused {
			t.Errorf("Host %q refused with a token", tc.host)
		}
	}
	var unchecked Checker
	if refused, _ := unchecked.Misdirected(httptest.NewRequest("GET", "http://anything.example/", nil)); refused {
		t.Error("refused without AllowHosts")
	}
}

func TestAllowHostsRefusesBadNames(t *testing.T) {
	var c Checker
	listen := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}
	if err := c.AllowHosts(listen, []string{"good.example"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"a b", "user@host", "host:0", ":80", "host/path", "2001:db8::zz"} {
		if err := c.AllowHosts(listen, []string{bad}); err == nil {
			t.Errorf("AllowHosts(%q): no error", bad)
		}
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Host = "good.example:1"
	if refused, _ := c.Misdirected(r); refused {
		t.Error("a refused call replaced the set in force")
	}
}
