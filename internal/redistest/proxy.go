package redistest

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// proxyDialTimeout bounds the proxy's connection to its target.
const proxyDialTimeout = time.Second

type proxyMode int

const (
	modeForward proxyMode = iota
	modeStall
	modeDrop
)

// Proxy is a TCP proxy on 127.0.0.1 in front of one target address, for
// fault-injection tests: point a client at Addr, then Drop, Stall and Resume
// the traffic. Its methods are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string
	ctx    context.Context // canceled by Close; bounds dials to the target
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	mode    proxyMode
	resumed chan struct{} // closed unless the proxy is stalled
	conns   map[*proxyConn]struct{}
	closed  bool
}

// proxyConn is one client connection and its connection to the target.
type proxyConn struct {
	client net.Conn
	server net.Conn      // nil until the dial to the target succeeds
	done   chan struct{} // closed when the pair is closed
	closed bool          // guarded by Proxy.mu
}

// StartProxy starts a proxy on a free port of 127.0.0.1 forwarding every
// connection to target. It starts in the forwarding state and is closed by
// t.Cleanup.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	resumed := make(chan struct{})
	close(resumed)
	p := &Proxy{
		ln:      ln,
		target:  target,
		ctx:     ctx,
		cancel:  cancel,
		resumed: resumed,
		conns:   make(map[*proxyConn]struct{}),
	}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the address clients should connect to, "127.0.0.1:<port>".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (e.g. EMFILE): back off briefly instead of spinning.
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		p.mu.Lock()
		if p.closed || p.mode == modeDrop {
			p.mu.Unlock()
			c.Close()
			continue
		}
		pc := &proxyConn{client: c, done: make(chan struct{})}
		p.conns[pc] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.handle(pc)
	}
}

func (p *Proxy) handle(pc *proxyConn) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.ctx, proxyDialTimeout)
	var d net.Dialer
	s, err := d.DialContext(ctx, "tcp", p.target)
	cancel()
	if err != nil {
		p.closeConn(pc)
		return
	}
	p.mu.Lock()
	if pc.closed {
		p.mu.Unlock()
		s.Close()
		return
	}
	pc.server = s
	p.wg.Add(2)
	p.mu.Unlock()
	go p.pump(pc, s, pc.client)
	go p.pump(pc, pc.client, s)
}

// pump copies src to dst, holding each chunk while the proxy is stalled, and
// closes the pair when either side fails.
func (p *Proxy) pump(pc *proxyConn, dst, src net.Conn) {
	defer p.wg.Done()
	defer p.closeConn(pc)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			resumed := p.resumed
			p.mu.Unlock()
			select {
			case <-resumed:
			case <-pc.done:
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) closeConn(pc *proxyConn) {
	p.mu.Lock()
	if pc.closed {
		p.mu.Unlock()
		return
	}
	pc.closed = true
	delete(p.conns, pc)
	close(pc.done)
	server := pc.server
	p.mu.Unlock()
	pc.client.Close()
	if server != nil {
		server.Close()
	}
}

// Drop closes every current connection and, until Resume, closes new ones
// as soon as they are accepted: clients see their connections reset or
// closed, as when the target crashes.
func (p *Proxy) Drop() {
	p.mu.Lock()
	p.mode = modeDrop
	p.mu.Unlock()
	p.closeAll()
}

// closeAll closes every current connection.
func (p *Proxy) closeAll() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	for _, pc := range conns {
		p.closeConn(pc)
	}
}

// Stall turns the proxy into a blackhole until Resume: connections, current
// and new, stay open but no byte is forwarded in either direction, as in a
// network partition. Bytes read meanwhile are delivered after Resume, as TCP
// retransmission would.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode != modeStall {
		p.resumed = make(chan struct{})
	}
	p.mode = modeStall
}

// Resume forwards traffic normally again after Drop or Stall. Connections
// accepted afterwards work; stalled connections continue.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == modeStall {
		close(p.resumed)
	}
	p.mode = modeForward
}

// Close stops the listener, closes every connection and waits until all of
// the proxy's goroutines have returned. It is idempotent and is called by
// t.Cleanup.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return
	}
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.ln.Close()
	p.closeAll()
	p.wg.Wait()
}
