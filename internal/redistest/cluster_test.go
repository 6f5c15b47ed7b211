package redistest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestCluster shares one 3-master, 1-replica cluster between its subtests;
// the failover subtest is destructive and runs last.
func TestCluster(t *testing.T) {
	start := time.Now()
	c := StartCluster(t, 3, 1)
	t.Logf("3x1 cluster ready in %v", time.Since(start))

	t.Run("topology", func(t *testing.T) {
		if n := len(c.Addrs()); n != 6 {
			t.Fatalf("Addrs() has %d nodes; want 6", n)
		}
		masters, replicas := c.Masters(), c.Replicas()
		if len(masters) != 3 || len(replicas) != 3 {
			t.Fatalf("%d masters, %d replicas; want 3 and 3", len(masters), len(replicas))
		}
		seen := map[*Server]bool{}
		for _, m := range masters {
			r := c.ReplicaOf(m)
			if r == nil || r == m {
				t.Fatalf("ReplicaOf(%s) = %v", m.Addr(), r)
			}
			seen[m], seen[r] = true, true
			role, err := doString(r.Addr(), time.Second, "INFO", "replication")
			if err != nil || infoField(role, "role") != "slave" ||
				infoField(role, "master_port") != fmt.Sprint(m.Port()) {
				t.Errorf("replica %s of %s: INFO replication %q, %v", r.Addr(), m.Addr(), role, err)
			}
		}
		if len(seen) != 6 {
			t.Errorf("masters and their replicas are %d distinct nodes; want 6", len(seen))
		}
		owners := map[*Server]int{}
		for slot := 0; slot < NumSlots; slot++ {
			owners[c.MasterOf(slot)]++
		}
		if len(owners) != 3 || owners[nil] != 0 {
			t.Errorf("slot owners: %v", owners)
		}
	})

	t.Run("SlotOf matches CLUSTER KEYSLOT", func(t *testing.T) {
		seed := uint64(time.Now().UnixNano())
		rng := rand.New(rand.NewPCG(seed, 0))
		addr := c.Addrs()[0]
		for i := range 200 {
			key := randomKey(rng, i)
			got, err := do(addr, time.Second, "CLUSTER", "KEYSLOT", key)
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
			}
			if want := int(got.(int64)); SlotOf(key) != want {
				t.Errorf("SlotOf(%q) = %d; CLUSTER KEYSLOT says %d (seed %d)", key, SlotOf(key), want, seed)
			}
		}
	})

	t.Run("keys spread over all masters", func(t *testing.T) {
		cc := NewClusterClient(c.Addrs()[0])
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		const n = 300
		perMaster := map[*Server]int{}
		for i := range n {
			key := fmt.Sprintf("spread:%d", i)
			if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
				t.Fatalf("SET %s: %v", key, err)
			}
			owner := c.MasterOf(SlotOf(key))
			perMaster[owner]++
			if i%50 == 0 { // the harness's idea of the owner is the server's
				if v, err := doString(owner.Addr(), time.Second, "GET", key); err != nil || v != fmt.Sprint(i) {
					t.Errorf("GET %s from %s = %q, %v", key, owner.Addr(), v, err)
				}
			}
		}
		total := 0
		for _, m := range c.Masters() {
			v, err := do(m.Addr(), time.Second, "DBSIZE")
			if err != nil {
				t.Fatal(err)
			}
			size := int(v.(int64))
			t.Logf("master %s holds %d keys", m.Addr(), size)
			if size == 0 || size != perMaster[m] {
				t.Errorf("master %s holds %d keys; SlotOf predicts %d", m.Addr(), size, perMaster[m])
			}
			total += size
		}
		if total != n {
			t.Errorf("masters hold %d keys; want %d", total, n)
		}
	})

	t.Run("failover", func(t *testing.T) {
		const key = "failover:key"
		slot := SlotOf(key)
		m := c.MasterOf(slot)
		r := c.ReplicaOf(m)
		m.Kill()
		killed := time.Now()
		c.WaitForFailover(t, m, 15*time.Second)
		t.Logf("failover of %s to %s took %v", m.Addr(), r.Addr(), time.Since(killed))
		if got := c.MasterOf(slot); got != r {
			t.Fatalf("after failover MasterOf(%d) = %v; want the replica %s", slot, got, r.Addr())
		}
		if len(c.Masters()) != 3 {
			t.Errorf("%d masters after failover; want 3", len(c.Masters()))
		}

		// A fresh cluster client can write the failed-over slot.
		cc := NewClusterClient(r.Addr())
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := cc.Set(ctx, key, "v", 0).Err(); err != nil {
			t.Fatalf("SET after failover: %v", err)
		}

		// The old master comes back empty and rejoins as a replica.
		m.Restart(t)
		restarted := time.Now()
		for c.ReplicaOf(r) != m {
			if time.Since(restarted) > 10*time.Second {
				t.Fatalf("restarted %s did not rejoin as replica of %s\n%s", m.Addr(), r.Addr(), c.describe())
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("restarted old master rejoined as replica after %v", time.Since(restarted))
	})
}

// randomKey returns keys of several shapes: plain, with a hash tag, with
// empty or unbalanced braces, and binary.
func randomKey(rng *rand.Rand, i int) string {
	word := func() string {
		const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789:-_."
		b := make([]byte, 1+rng.IntN(12))
		for j := range b {
			b[j] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	switch i % 8 {
	case 0:
		return word()
	case 1:
		return word() + "{" + word() + "}" + word()
	case 2:
		return "{" + word() + "}"
	case 3:
		return word() + "{}" + word() + "{" + word() + "}"
	case 4:
		return word() + "{" + word()
	case 5:
		return word() + "}" + word() + "{" + word() + "}"
	case 6:
		return "{{" + word() + "}}" + word()
	default:
		b := make([]byte, 1+rng.IntN(20))
		for j := range b {
			b[j] = byte(rng.IntN(256))
		}
		return strings.ToValidUTF8(string(b), "") + string(b)
	}
}
