package main_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// upstreamEcho is an upstream that answers with the forwarding headers it
// received.
func upstreamEcho(t *testing.T) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "xff=%q fwd=%q", r.Header.Get("X-Forwarded-For"), r.Header.Get("Forwarded"))
	}))
	t.Cleanup(up.Close)
	return up
}

func proxyGet(t *testing.T, addr string, hdr ...string) result {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/x", nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return do(t, req)
}

func TestServeUpstreamHardening(t *testing.T) {
	t.Parallel()
	up := upstreamEcho(t)

	t.Run("a header key longer than 1024 bytes is refused with 431", func(t *testing.T) {
		p := serve(t, nil, "--upstream", up.URL, "--admin-listen", "127.0.0.1:0", "--key", "header:X-API-Key")
		if r := proxyGet(t, p.addr, "X-API-Key", strings.Repeat("k", 900<<10)); r.code != 431 {
			t.Errorf("a 900 KB key: %d %.80q", r.code, r.raw)
		}
		if r := proxyGet(t, p.addr, "X-API-Key", strings.Repeat("k", 1024)); r.code != 200 {
			t.Errorf("a 1024-byte key: %d %.80q", r.code, r.raw)
		}
		p.stop(t)
	})

	t.Run("the upstream gets only the forwarding chain the trusted proxies vouch for", func(t *testing.T) {
		p := serve(t, nil, "--upstream", up.URL, "--admin-listen", "127.0.0.1:0")
		if r := proxyGet(t, p.addr, "X-Forwarded-For", "6.6.6.6"); r.raw != `xff="127.0.0.1" fwd=""` {
			t.Errorf("no trusted proxy, a client's own X-Forwarded-For: upstream saw %s", r.raw)
		}
		p.stop(t)
		p = serve(t, nil, "--upstream", up.URL, "--admin-listen", "127.0.0.1:0", "--trusted-proxies", "127.0.0.1", "--forwarded-header", "Forwarded")
		if r := proxyGet(t, p.addr, "Forwarded", "for=6.6.6.6, for=203.0.113.5"); r.raw != `xff="203.0.113.5, 127.0.0.1" fwd="for=203.0.113.5, for=127.0.0.1"` {
			t.Errorf("Forwarded from a trusted proxy: upstream saw %s", r.raw)
		}
		wantMetric(t, metrics(t, p.admin), `ratelimit_proxy_requests_total{code="200"} 1`)
		p.stop(t)
	})

	t.Run("IPv6 clients are keyed by their /64 unless --ipv6-prefix says otherwise", func(t *testing.T) {
		cfg := perMinute(t, 10)
		for _, tt := range []struct {
			args    []string
			allowed int
		}{
			{nil, 10},
			{[]string{"--ipv6-prefix", "128"}, 12},
		} {
			args := append([]string{"--upstream", up.URL, "--admin-listen", "127.0.0.1:0", "--trusted-proxies", "127.0.0.1", "--config", cfg}, tt.args...)
			p := serve(t, nil, args...)
			allowed := 0
			for i := 1; i <= 12; i++ {
				if r := proxyGet(t, p.addr, "X-Forwarded-For", fmt.Sprintf("2001:db8:1:2::%x", i)); r.code == 200 {
					allowed++
				}
			}
			if allowed != tt.allowed {
				t.Errorf("%v: %d of 12 addresses of one /64 allowed, want %d", tt.args, allowed, tt.allowed)
			}
			p.stop(t)
		}
	})

	t.Run("a slow body is cut off by --read-timeout", func(t *testing.T) {
		p := serve(t, nil, "--upstream", up.URL, "--admin-listen", "127.0.0.1:0", "--read-timeout", "300ms")
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		_, err = io.ReadAll(c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the connection of a stalled body was still open after 5 s")
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("a stalled body held its connection %v", took)
		}
		p.stop(t)
	})

	t.Run("--max-connections bounds the connections served at once", func(t *testing.T) {
		p := serve(t, nil, "--upstream", up.URL, "--admin-listen", "127.0.0.1:0", "--max-connections", "2")
		var idle []net.Conn
		for range 2 {
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				t.Fatal(err)
			}
			idle = append(idle, c)
		}
		fast := &http.Client{Timeout: 300 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
		if res, err := fast.Get("http://" + p.addr + "/x"); err == nil {
			res.Body.Close()
			t.Errorf("a third connection was served beside two open ones: %d", res.StatusCode)
		}
		idle[0].Close()
		defer idle[1].Close()
		slow := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		res, err := slow.Get("http://" + p.addr + "/x")
		if err != nil {
			t.Fatalf("after one closed: %v", err)
		}
		res.Body.Close()
		idle[1].Close()
		p.stop(t)
	})
}
