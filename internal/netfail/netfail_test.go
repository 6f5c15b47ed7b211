package netfail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/internal/testkit"
)

func TestIs(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("a call of a store: %w", err) }
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"no error", nil, false},
		{"a refused dial", wrap(&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}), true},
		{"a reset connection", wrap(&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}), true},
		{"a broken pipe", wrap(os.NewSyscallError("write", syscall.EPIPE)), true},
		{"an unreachable network", wrap(os.NewSyscallError("connect", syscall.ENETUNREACH)), true},
		{"EOF", wrap(io.EOF), true},
		{"an unexpected EOF", wrap(io.ErrUnexpectedEOF), true},
		{"a read timeout", wrap(readTimeoutError(t)), true},
		{"an I/O deadline", wrap(os.ErrDeadlineExceeded), true},
		{"a closed connection", wrap(net.ErrClosed), true},
		{"a DNS failure", wrap(&net.DNSError{Err: "no such host", Name: "redis.invalid"}), true},
		{"one of several joined errors", errors.Join(errors.New("first"), wrap(io.EOF)), true},
		{"a context deadline (the caller's to judge)", wrap(context.DeadlineExceeded), false},
		{"a cancelled context", wrap(context.Canceled), false},
		{"an answer of the peer", wrap(errors.New("WRONGTYPE Operation against a key holding the wrong kind of value")), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := Is(tt.err); got != tt.want {
				t.Errorf("Is(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

// readTimeoutError returns the error of a real read on a loopback
// connection whose deadline has passed.
func readTimeoutError(t *testing.T) error {
	t.Helper()
	ln := testkit.Listen(t)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(time.Millisecond))
	_, err = c.Read(make([]byte, 1))
	if err == nil {
		t.Fatal("read on a silent connection returned no error")
	}
	return err
}
