package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// clusterReadyTimeout bounds the wait for a new cluster to converge.
	clusterReadyTimeout = 20 * time.Second
	// clusterCreateTimeout bounds redis-cli --cluster create.
	clusterCreateTimeout = 30 * time.Second
	// queryTimeout bounds each harness query to one node.
	queryTimeout = time.Second
)

// topologyTTL is how long a CLUSTER SLOTS reply is reused by Masters,
// Replicas, MasterOf and ReplicaOf, so that loops over many slots do not open
// a connection per call.
const topologyTTL = 100 * time.Millisecond

// clusterArgs are the redis-server arguments of every cluster node. A node
// timeout of 1 s makes failover take about two seconds.
//
// repl-ping-replica-period 1 (default 10): Redis 7 leaves a replica out of
// CLUSTER SLOTS until its replication offset is non-zero, and on an idle
// master the offset only moves with these pings, so with the default a new
// cluster's replicas stay invisible to clients (and to the readiness check)
// for about 10 s. repl-diskless-sync-delay 0 (default 5 s) lets a replica's
// first full sync start at once instead of waiting for more replicas.
var clusterArgs = []string{
	"--cluster-enabled", "yes",
	"--cluster-config-file", "nodes.conf",
	"--cluster-node-timeout", "1000",
	"--cluster-require-full-coverage", "no",
	"--cluster-allow-reads-when-down", "no",
	"--repl-ping-replica-period", "1",
	"--repl-diskless-sync-delay", "0",
}

// Cluster is a Redis Cluster of redis-server processes on 127.0.0.1, started
// by [StartCluster]. Role queries (Masters, Replicas, MasterOf, ReplicaOf)
// ask a live node with CLUSTER SLOTS, so they follow failovers (a reply is
// reused for at most 100 ms; WaitForFailover refreshes it); when no node
// answers they return the last topology seen. Its methods are safe for
// concurrent use.
type Cluster struct {
	nodes  []*Server
	byAddr map[string]*Server

	mu     sync.Mutex
	topo   []slotRange // last CLUSTER SLOTS reply that parsed
	topoAt time.Time   // when topo was read
}

// slotRange is one entry of a CLUSTER SLOTS reply.
type slotRange struct {
	start, end int
	master     string
	replicas   []string
}

// StartCluster starts masters*(1+replicasPerMaster) cluster-enabled
// redis-server processes (see [StartServer]; each has its own port, cluster
// bus port and temp dir, a 1 s cluster-node-timeout, and
// cluster-require-full-coverage no), joins them with
// "redis-cli --cluster create ... --cluster-replicas N --cluster-yes", and
// waits up to 20 s until every node reports cluster_state:ok, every node's
// CLUSTER SLOTS covers all 16384 slots with masters masters of
// replicasPerMaster replicas each, and every replica's link to its master is
// up. masters must be at least 3, as redis-cli requires. All processes are
// killed by t.Cleanup. Under go test -short it skips the test instead:
// a cluster is the slowest thing the tests start.
func StartCluster(t testing.TB, masters, replicasPerMaster int) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: starts no Redis Cluster (%d redis-server processes); run without -short", masters*(1+replicasPerMaster))
	}
	if masters < 3 || replicasPerMaster < 0 {
		t.Fatalf("redistest: StartCluster(%d, %d): redis-cli --cluster create needs at least 3 masters and a non-negative replica count", masters, replicasPerMaster)
	}
	serverPath, cliPath := Find(t)
	n := masters * (1 + replicasPerMaster)
	c := &Cluster{byAddr: make(map[string]*Server, n)}
	t.Cleanup(c.Close)
	for range n {
		s := startServer(t, serverPath, clusterArgs)
		c.nodes = append(c.nodes, s)
		c.byAddr[s.Addr()] = s
	}

	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), clusterCreateTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, cliPath, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}

	deadline := time.Now().Add(clusterReadyTimeout)
	for {
		reason := c.notReady(masters, replicasPerMaster)
		if reason == "" {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: cluster not ready after %v: %s\nredis-cli output:\n%s\n%s",
				clusterReadyTimeout, reason, out, c.describe())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// okSlots returns the slot ranges node s reports, or why it cannot: it does
// not answer, or its cluster_state is not ok.
func (c *Cluster) okSlots(s *Server) ([]slotRange, string) {
	info, err := doString(s.Addr(), queryTimeout, "CLUSTER", "INFO")
	if err != nil {
		return nil, fmt.Sprintf("%s: CLUSTER INFO: %v", s.Addr(), err)
	}
	if st := infoField(info, "cluster_state"); st != "ok" {
		return nil, fmt.Sprintf("%s: cluster_state:%s", s.Addr(), st)
	}
	ranges, err := c.slotsFrom(s)
	if err != nil {
		return nil, err.Error()
	}
	return ranges, ""
}

// notReady returns why the cluster has not converged yet, or "".
func (c *Cluster) notReady(masters, replicasPerMaster int) string {
	var first []slotRange
	for _, s := range c.nodes {
		ranges, why := c.okSlots(s)
		if why != "" {
			return why
		}
		if err := checkCoverage(ranges); err != nil {
			return fmt.Sprintf("%s: %v", s.Addr(), err)
		}
		owners := map[string][]string{}
		for _, r := range ranges {
			if _, ok := c.byAddr[r.master]; !ok {
				return fmt.Sprintf("%s: slots %d-%d owned by unknown node %s", s.Addr(), r.start, r.end, r.master)
			}
			if len(r.replicas) != replicasPerMaster {
				return fmt.Sprintf("%s: slots %d-%d have replicas %v, want %d", s.Addr(), r.start, r.end, r.replicas, replicasPerMaster)
			}
			owners[r.master] = r.replicas
		}
		if len(owners) != masters {
			return fmt.Sprintf("%s: %d masters own slots, want %d", s.Addr(), len(owners), masters)
		}
		if first == nil {
			first = ranges
		} else if !sameTopology(first, ranges) {
			return fmt.Sprintf("%s: CLUSTER SLOTS differs from %s", s.Addr(), c.nodes[0].Addr())
		}
	}
	for _, r := range first {
		for _, addr := range r.replicas {
			info, err := doString(addr, queryTimeout, "INFO", "replication")
			if err != nil {
				return fmt.Sprintf("%s: INFO replication: %v", addr, err)
			}
			if st := infoField(info, "master_link_status"); st != "up" {
				return fmt.Sprintf("replica %s: master_link_status:%s", addr, st)
			}
		}
	}
	c.setTopology(first)
	return ""
}

func checkCoverage(ranges []slotRange) error {
	next := 0
	for _, r := range ranges { // sorted by start
		if r.start != next {
			return fmt.Errorf("slots %d-%d not covered", next, r.start-1)
		}
		next = r.end + 1
	}
	if next != NumSlots {
		return fmt.Errorf("slots %d-%d not covered", next, NumSlots-1)
	}
	return nil
}

func sameTopology(a, b []slotRange) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].start != b[i].start || a[i].end != b[i].end || a[i].master != b[i].master ||
			strings.Join(a[i].replicas, ",") != strings.Join(b[i].replicas, ",") {
			return false
		}
	}
	return true
}

// slotsFrom reads CLUSTER SLOTS from s, sorted by first slot, with each
// range's replicas sorted.
func (c *Cluster) slotsFrom(s *Server) ([]slotRange, error) {
	v, err := do(s.Addr(), queryTimeout, "CLUSTER", "SLOTS")
	if err != nil {
		return nil, fmt.Errorf("%s: CLUSTER SLOTS: %v", s.Addr(), err)
	}
	ranges, err := parseClusterSlots(v)
	if err != nil {
		return nil, fmt.Errorf("%s: CLUSTER SLOTS: %v", s.Addr(), err)
	}
	return ranges, nil
}

func parseClusterSlots(v any) ([]slotRange, error) {
	entries, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("reply is %T, not an array", v)
	}
	ranges := make([]slotRange, 0, len(entries))
	for _, e := range entries {
		fields, ok := e.([]any)
		if !ok || len(fields) < 3 {
			return nil, fmt.Errorf("malformed entry %v", e)
		}
		start, ok1 := fields[0].(int64)
		end, ok2 := fields[1].(int64)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("malformed slot range %v", e)
		}
		r := slotRange{start: int(start), end: int(end)}
		for i, f := range fields[2:] {
			node, ok := f.([]any)
			if !ok || len(node) < 2 {
				return nil, fmt.Errorf("malformed node %v", f)
			}
			ip, ok1 := node[0].(string)
			port, ok2 := node[1].(int64)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("malformed node %v", f)
			}
			addr := net.JoinHostPort(ip, strconv.FormatInt(port, 10))
			if i == 0 {
				r.master = addr
			} else {
				r.replicas = append(r.replicas, addr)
			}
		}
		sort.Strings(r.replicas)
		ranges = append(ranges, r)
	}
	sort.Slice(ranges, func(i, j int) bool { return ranges[i].start < ranges[j].start })
	return ranges, nil
}

func (c *Cluster) setTopology(ranges []slotRange) {
	c.mu.Lock()
	c.topo, c.topoAt = ranges, time.Now()
	c.mu.Unlock()
}

func (c *Cluster) cachedTopology() []slotRange {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.topo
}

// topology returns the slot map: the cached one when it is younger than
// topologyTTL, else the answer of the first running node to CLUSTER SLOTS,
// else (no node answers) the last one seen.
func (c *Cluster) topology() []slotRange {
	c.mu.Lock()
	if c.topo != nil && time.Since(c.topoAt) < topologyTTL {
		defer c.mu.Unlock()
		return c.topo
	}
	c.mu.Unlock()
	return c.refreshTopology()
}

// refreshTopology asks the first running node for CLUSTER SLOTS, falling
// back to the last topology seen when none answers.
func (c *Cluster) refreshTopology() []slotRange {
	for _, s := range c.nodes {
		if !s.running() {
			continue
		}
		if ranges, err := c.slotsFrom(s); err == nil && len(ranges) > 0 {
			c.setTopology(ranges)
			return ranges
		}
	}
	return c.cachedTopology()
}

// Addrs returns the addresses of all nodes, masters and replicas, in the
// order they were started.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Nodes returns all nodes, masters and replicas, in the order they were
// started.
func (c *Cluster) Nodes() []*Server { return append([]*Server(nil), c.nodes...) }

// Masters returns the nodes that currently own slots, ordered by their
// lowest slot.
func (c *Cluster) Masters() []*Server {
	var out []*Server
	seen := map[string]bool{}
	for _, r := range c.topology() {
		if s := c.byAddr[r.master]; s != nil && !seen[r.master] {
			seen[r.master] = true
			out = append(out, s)
		}
	}
	return out
}

// Replicas returns the nodes currently listed as replicas of a slot owner,
// grouped by master in the order of Masters.
func (c *Cluster) Replicas() []*Server {
	var out []*Server
	seen := map[string]bool{}
	for _, r := range c.topology() {
		for _, addr := range r.replicas {
			if s := c.byAddr[addr]; s != nil && !seen[addr] {
				seen[addr] = true
				out = append(out, s)
			}
		}
	}
	return out
}

// MasterOf returns the node that currently owns slot (see [SlotOf]), or nil
// when no node does.
func (c *Cluster) MasterOf(slot int) *Server {
	for _, r := range c.topology() {
		if r.start <= slot && slot <= r.end {
			return c.byAddr[r.master]
		}
	}
	return nil
}

// ReplicaOf returns a replica currently serving master, or nil when it has
// none.
func (c *Cluster) ReplicaOf(master *Server) *Server {
	for _, r := range c.topology() {
		if r.master == master.Addr() && len(r.replicas) > 0 {
			return c.byAddr[r.replicas[0]]
		}
	}
	return nil
}

// WaitForFailover waits until the slots that killedMaster owned (as last
// seen by the harness, normally before it was killed or stopped) are owned by
// other, running nodes, as read with CLUSTER SLOTS from every running node,
// and every running node reports cluster_state:ok. It fails the test with the
// nodes' view when that takes longer than timeout.
func (c *Cluster) WaitForFailover(t testing.TB, killedMaster *Server, timeout time.Duration) {
	t.Helper()
	var lost [][2]int
	for _, r := range c.cachedTopology() {
		if r.master == killedMaster.Addr() {
			lost = append(lost, [2]int{r.start, r.end})
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		reason := c.failoverPending(killedMaster, lost)
		if reason == "" {
			c.refreshTopology()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: no failover of %s within %v: %s\n%s", killedMaster.Addr(), timeout, reason, c.describe())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// failoverPending returns why the failover of killed is not complete, or "".
func (c *Cluster) failoverPending(killed *Server, lost [][2]int) string {
	live := 0
	for _, s := range c.nodes {
		if s == killed || !s.running() {
			continue
		}
		live++
		ranges, why := c.okSlots(s)
		if why != "" {
			return why
		}
		for _, l := range lost {
			for slot := l[0]; slot <= l[1]; {
				r, ok := rangeOf(ranges, slot)
				if !ok {
					return fmt.Sprintf("%s: slot %d has no owner", s.Addr(), slot)
				}
				owner := c.byAddr[r.master]
				if owner == nil || owner == killed || !owner.running() {
					return fmt.Sprintf("%s: slot %d still owned by %s", s.Addr(), slot, r.master)
				}
				slot = r.end + 1
			}
		}
	}
	if live == 0 {
		return "no running node"
	}
	return ""
}

func rangeOf(ranges []slotRange, slot int) (slotRange, bool) {
	for _, r := range ranges {
		if r.start <= slot && slot <= r.end {
			return r, true
		}
	}
	return slotRange{}, false
}

// describe returns every running node's CLUSTER NODES, for failure messages.
func (c *Cluster) describe() string {
	var b strings.Builder
	for _, s := range c.nodes {
		if !s.running() {
			fmt.Fprintf(&b, "--- %s: not running\n", s.Addr())
			continue
		}
		nodes, err := doString(s.Addr(), queryTimeout, "CLUSTER", "NODES")
		if err != nil {
			fmt.Fprintf(&b, "--- %s: CLUSTER NODES: %v\n", s.Addr(), err)
			continue
		}
		fmt.Fprintf(&b, "--- CLUSTER NODES from %s:\n%s", s.Addr(), nodes)
	}
	return b.String()
}

// Close kills every node. It is idempotent and is called by t.Cleanup.
func (c *Cluster) Close() {
	for _, s := range c.nodes {
		s.Close()
	}
}
