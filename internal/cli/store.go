package cli

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

// stores is the store a command decides with, and what it takes to run it.
type stores struct {
	store ratelimit.Store // what limiters use
	name  string          // for the log, without credentials
	// redis is the client, nil for the embedded store.
	redis redis.UniversalClient
	// fb is the outage wrapper around Redis, nil for the embedded store or
	// when none was asked for.
	fb      *fallback.Store
	closers []func() error
}

// degraded reports whether the store is serving without Redis.
func (s *stores) degraded() bool { return s.fb != nil && !s.fb.IsAlive() }

// close closes every client.
func (s *stores) close() {
	for _, c := range s.closers {
		c() //nolint:errcheck // closing at exit
	}
}

// storeOptions say how to build the store.
type storeOptions struct {
	redis      redisFlags
	outage     ratelimit.Outage
	useOutage  bool // wrap Redis in package fallback
	fleetShare int
	timeout    time.Duration
	// observer is told every change of Redis's state, with useOutage.
	observer ratelimit.FallbackObserver
}

// openStore builds the embedded store, or a Redis store from the flags,
// wrapped in fallback with the outage behaviour when useOutage is set.
// It does no I/O.
func openStore(o storeOptions) (*stores, error) {
	uo, desc, err := o.redis.options()
	if err != nil {
		return nil, usageError{err}
	}
	if uo == nil {
		return &stores{store: memstore.New(), name: "memory (embedded, this process only)"}, nil
	}
	client := newClient(uo)
	s := &stores{name: desc, redis: client, closers: []func() error{client.Close}}
	primary := redisstore.New(client)
	s.store = primary
	if !o.useOutage {
		return s, nil
	}
	opts := []fallback.Option{fallback.WithOutage(o.outage), fallback.WithTimeout(o.timeout)}
	if o.fleetShare > 1 {
		opts = append(opts, fallback.WithFleetShare(o.fleetShare))
	}
	if o.observer != nil {
		opts = append(opts, fallback.WithObserver(o.observer))
	}
	// On a single server fallback probes with the primary's own Ping
	// (redisstore.Store.Ping: a PING on a connection of its own, which
	// sees Redis back before the client's pool would dial again).
	if cc, ok := client.(*redis.ClusterClient); ok {
		// On Cluster, one liveness flag per master: one master down is not
		// the whole cluster down.
		probes := &probeClients{opts: uo}
		s.closers = append(s.closers, probes.close)
		cp := &clusterPartitions{cc: cc, probes: probes}
		opts = append(opts, fallback.WithPartitions(cp.partition, cp.ping))
	}
	fb, err := fallback.New(primary, opts...)
	if err != nil {
		s.close()
		return nil, err
	}
	s.fb = fb
	s.store = fb
	return s, nil
}

// clusterPartitions name a key's partition by the address of the master
// that owns its slot, and ping a partition on a connection of its own.
type clusterPartitions struct {
	cc     *redis.ClusterClient
	probes *probeClients
	sample sync.Map // master address -> a key it served
}

func (p *clusterPartitions) partition(ctx context.Context, key string) string {
	m, err := p.cc.MasterForKey(ctx, key)
	if err != nil {
		return "" // no topology yet: the whole cluster is one partition
	}
	addr := m.Options().Addr
	if _, ok := p.sample.Load(addr); !ok {
		p.sample.LoadOrStore(addr, key)
	}
	return addr
}

// ping pings the master at addr. When it fails it asks go-redis to reload
// the topology: the breaker keeps every check away from a dead master, so
// nothing else would make it find the replica promoted in its place. Once
// the reloaded topology gives the master's slots to another node, the old
// address serves no key any more and its partition is reported alive, so
// that the store is not held in an outage by a node that left.
func (p *clusterPartitions) ping(ctx context.Context, addr string) error {
	if addr == "" {
		return p.cc.Ping(ctx).Err()
	}
	err := p.probes.ping(ctx, addr)
	if err == nil {
		return nil
	}
	p.cc.ReloadState(ctx)
	if key, ok := p.sample.Load(addr); ok {
		if m, merr := p.cc.MasterForKey(ctx, key.(string)); merr == nil && m.Options().Addr != addr {
			p.sample.Delete(addr)
			return nil
		}
	}
	return err
}

// probeClients are single-connection clients for the liveness probe of
// each Redis Cluster master, one per address. A client whose ping failed is
// closed and replaced at the next ping: go-redis's pool, once as many dials
// as its size have failed, dials again only about once a second, which
// would hold the probe back.
type probeClients struct {
	opts    *redis.UniversalOptions
	mu      sync.Mutex
	clients map[string]*redis.Client
}

func (p *probeClients) get(addr string) *redis.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.clients[addr]; c != nil {
		return c
	}
	if p.clients == nil {
		p.clients = map[string]*redis.Client{}
	}
	o := p.opts.Simple()
	o.Addr = addr
	o.DB = 0 // Cluster has only database 0
	o.PoolSize = 1
	o.MinIdleConns = 0
	o.MaxRetries = -1
	o.ContextTimeoutEnabled = true
	o.DialerRetries = 1
	c := redis.NewClient(o)
	p.clients[addr] = c
	return c
}

// ping pings addr on its probe client, and drops the client when it fails.
func (p *probeClients) ping(ctx context.Context, addr string) error {
	c := p.get(addr)
	err := c.Ping(ctx).Err()
	if err != nil {
		p.mu.Lock()
		if p.clients[addr] == c {
			delete(p.clients, addr)
		}
		p.mu.Unlock()
		c.Close()
	}
	return err
}

func (p *probeClients) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.clients {
		c.Close()
	}
	p.clients = nil
	return nil
}

// parseOutage reads an outage behaviour by its name.
func parseOutage(s string) (ratelimit.Outage, error) {
	for _, o := range []ratelimit.Outage{ratelimit.ReturnError, ratelimit.FailOpen, ratelimit.FailClosed, ratelimit.LocalFallback} {
		if strings.EqualFold(s, o.String()) {
			return o, nil
		}
	}
	return 0, usagef("--outage %q: want fail-closed, fail-open, local-fallback or return-error", s)
}

// pingStore checks that Redis answers, for a command that needs it now.
func (s *stores) ping(ctx context.Context, timeout time.Duration) error {
	if s.redis == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := s.redis.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	return nil
}
