package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

func TestOutageLogsKeepSubjectsOut(t *testing.T) {
	secret := "sk_live_" + strings.Repeat("5", 40)
	for _, tt := range []struct {
		cause error
		want  string
	}{
		{fmt.Errorf("ratelimit: redis check of %q: %w", "7:default:"+secret, errors.New("EOF")), `level=WARN msg="redis unreachable`},
		{fmt.Errorf("ratelimit: redis check of %q: %w", "7:default:"+strings.Repeat(secret, 30000), errors.New("EOF")), `level=WARN msg="redis unreachable`},
		{errors.New("WRONGPASS invalid username-password pair or user is disabled."), "level=ERROR msg=\"redis refuses this service's credentials or permissions: a configuration error, not an outage"},
		{fmt.Errorf("ratelimit: redis check of %q: %w", "7:default:"+secret, errors.New("NOPERM this user has no permissions to run the 'evalsha' command")), "level=ERROR"},
	} {
		var logs strings.Builder
		obs := logOutages(slog.New(slog.NewTextHandler(&logs, nil)))
		obs.ObserveFallback(context.Background(), fallback.Event{Outage: fallback.FailClosed, Cause: tt.cause})
		if strings.Contains(logs.String(), "5555555555") || !strings.Contains(logs.String(), `default:#`) && strings.Contains(tt.cause.Error(), secret) {
			t.Errorf("the outage log shows the subject, or not its namespace and hash: %.300s", logs.String())
		}
		if !strings.Contains(logs.String(), tt.want) || len(logs.String()) > 600 {
			t.Errorf("log %.300q (%d bytes), want %q", logs.String(), len(logs.String()), tt.want)
		}
	}
}

func TestWarnExposure(t *testing.T) {
	all, _ := netip.ParsePrefix("0.0.0.0/0")
	for _, tt := range []struct {
		addr    net.Addr
		token   string
		trusted []netip.Prefix
		want    string
	}{
		{&net.TCPAddr{IP: net.IPv4zero, Port: 8080}, "", nil, "beyond loopback without a bearer token"},
		{&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 8080}, "", nil, "beyond loopback without a bearer token"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 8080}, "tok", nil, ""},
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}, "", nil, ""},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 8080}, "", []netip.Prefix{all}, "trusts every address"},
	} {
		var logs strings.Builder
		warnExposure(slog.New(slog.NewTextHandler(&logs, nil)), tt.addr, tt.token, tt.trusted)
		if tt.want == "" && logs.Len() > 0 || !strings.Contains(logs.String(), tt.want) {
			t.Errorf("%v token %q trusted %v: log %q, want %q", tt.addr, tt.token, tt.trusted, logs.String(), tt.want)
		}
	}
}

func TestLimitListenerClosesWhileFull(t *testing.T) {
	ln := testkit.Listen(t)
	l := limitConns(ln, 1)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		errc <- err
	}()
	l.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept still blocked 5 s after Close with every slot taken")
	}
}
