package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// memResult is the Redis memory one subject costs a limiter.
type memResult struct {
	name   string
	keys   int     // keys one subject creates
	usage  int64   // MEMORY USAGE of those keys, summed
	growth float64 // used_memory growth per subject over n subjects; <0 when not measured
	value  string  // a stored value, quoted, for the report
	note   string
}

// memCost is the tokens each subject spends in the memory measurement: half
// the burst, so that every key lives at least half a second (a check of one
// token at 1000/s is refilled, and our key expires, after 1 ms), with values
// as wide as after a one-token check.
func memCost(p policy) int64 { return p.burst / 2 }

func randHex() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// usedMemory returns used_memory less mem_clients_normal: the clients'
// query and reply buffers grow and shrink with the traffic (a pipeline
// fills them more than single commands), and are no part of what a
// subject costs.
func usedMemory(ctx context.Context, admin *redis.Client) (int64, error) {
	info, err := admin.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	used, err := infoInt(info, "used_memory")
	if err != nil {
		return 0, err
	}
	clients, err := infoInt(info, "mem_clients_normal")
	if err != nil {
		return 0, err
	}
	return used - clients, nil
}

func infoInt(info, field string) (int64, error) {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in INFO", field)
}

func infoFloat(info, field string) (float64, error) {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("no %s in INFO", field)
}

// probeKeys returns the keys whose names contain marker.
func probeKeys(ctx context.Context, admin *redis.Client, marker string) ([]string, error) {
	var keys []string
	iter := admin.Scan(ctx, 0, "*"+marker+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	return keys, iter.Err()
}

// measureMemory measures one limiter: the keys one subject creates and their
// MEMORY USAGE, and, when owned (this program started the server, so it may
// flush it and pause expiry), the growth of used_memory over n subjects
// checked once each on an emptied server with active expiry paused, so that
// none of them is reclaimed before the count.
func measureMemory(ctx context.Context, admin *redis.Client, owned bool, name string, build func() (Checker, error), p policy, n int) (memResult, error) {
	res := memResult{name: name, growth: -1}
	chk, err := build()
	if err != nil {
		return res, err
	}
	defer chk.Close()
	cost := memCost(p)

	// Subjects as long as "user:1234", so every limiter's key is its own
	// prefix and nine characters.
	marker := "p" + randHex()
	if _, err := chk.Check(ctx, marker, cost); err != nil {
		return res, err
	}
	keys, err := probeKeys(ctx, admin, marker)
	if err != nil {
		return res, err
	}
	res.keys = len(keys)
	var vals []string
	for _, k := range keys {
		u, err := admin.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			return res, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
		}
		res.usage += u
		if typ, _ := admin.Type(ctx, k).Result(); typ == "string" {
			v, _ := admin.Get(ctx, k).Result()
			vals = append(vals, fmt.Sprintf("%s=%q", k, v))
		} else {
			vals = append(vals, k+" ("+typ+")")
		}
	}
	res.value = strings.Join(vals, ", ")
	if !owned {
		return res, nil
	}

	const conc = 8
	fill := func(prefix string, count int) error {
		var wg sync.WaitGroup
		errs := make(chan error, conc)
		for w := range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < count; i += conc {
					if _, err := chk.Check(ctx, prefix+strconv.Itoa(i), cost); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
	// Warm the client's connections, then start from an empty server.
	if err := fill("warm-", 4*conc); err != nil {
		return res, err
	}
	if err := admin.Do(ctx, "DEBUG", "SET-ACTIVE-EXPIRE", "0").Err(); err != nil {
		return res, fmt.Errorf("DEBUG SET-ACTIVE-EXPIRE (needs enable-debug-command): %w", err)
	}
	defer admin.Do(ctx, "DEBUG", "SET-ACTIVE-EXPIRE", "1")
	if err := admin.FlushAllAsync(ctx).Err(); err != nil {
		return res, err
	}
	if err := admin.Do(ctx, "FLUSHALL", "SYNC").Err(); err != nil {
		return res, err
	}
	// The growth is a slope: n subjects first, then n more, and the
	// difference between the two counts. Whatever the traffic itself leaves
	// behind once (buffers, script caches, allocator state) is in both and
	// cancels; what each subject keeps is counted n times.
	if err := fill("f"+randHex()[:4]+":", n); err != nil {
		return res, err
	}
	// Let serverCron finish the incremental rehash of the key and expiry
	// tables (1 ms of it every 100 ms), so that no old table is counted.
	time.Sleep(500 * time.Millisecond)
	m0, err := usedMemory(ctx, admin)
	if err != nil {
		return res, err
	}
	if err := fill("g"+randHex()[:4]+":", n); err != nil {
		return res, err
	}
	time.Sleep(500 * time.Millisecond)
	m1, err := usedMemory(ctx, admin)
	if err != nil {
		return res, err
	}
	res.growth = float64(m1-m0) / float64(n)
	return res, admin.Do(ctx, "FLUSHALL", "SYNC").Err()
}
