package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/redis/go-redis/v9"
)

func TestZZProfile(t *testing.T) {
	for _, quota := range []bool{false, true} {
		ctx := context.Background()
		vg, _ := exec.LookPath("valgrind")
		rs, _ := findBinary("redis-server")
		port, _ := freePort()
		dir := t.TempDir()
		out := filepath.Join(dir, "cg.out")
		cmd := exec.Command(vg, "--tool=callgrind", "--callgrind-out-file="+out, "--toggle-collect=luaD_precall", rs, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
		cmd = exec.Command(vg, "--tool=callgrind", "--callgrind-out-file="+out, rs, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
		cmd.Start()
		c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1, PoolSize: 1, ReadTimeout: time.Minute, WriteTimeout: time.Minute, DisableIdentity: true})
		for c.Ping(ctx).Err() != nil {
			time.Sleep(100 * time.Millisecond)
		}
		lib, fn := script.Library, script.Function
		if src := os.Getenv("LUA"); src != "" {
			b, _ := os.ReadFile(src)
			fn = "exp_" + strconv.Itoa(len(b))
			lib = "#!lua name=" + fn + "\nlocal NAME = '" + fn + "'\n" + string(b)
		}
		if err := c.FunctionLoad(ctx, lib).Err(); err != nil {
			t.Fatal(err)
		}
		r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.NewLimit(1, time.Hour, 1000)}, Cost: 1}
		if quota {
			r.Quotas = []ratelimit.Quota{ratelimit.CalendarQuota(1<<50, ratelimit.Month, nil)}
		}
		var enc script.Encoder
		for i := range 4000 {
			args := script.CallArgs(r, script.Each, 1)
			args = enc.AppendRequest(args, r)
			if _, err := c.FCall(ctx, fn, []string{fmt.Sprintf("ic:%d", i%1000)}, args...).Result(); err != nil {
				t.Fatal(err)
			}
		}
		c.Shutdown(ctx)
		cmd.Wait()
		a, _ := exec.Command("callgrind_annotate", "--threshold=98", out).Output()
		os.WriteFile(fmt.Sprintf("/tmp/cg-%v.txt", quota), a, 0o644)
		var tot int64
		fmt.Sscanf(strings.TrimSpace(strings.Split(strings.Split(string(a), "PROGRAM TOTALS")[0], "\n")[len(strings.Split(strings.Split(string(a), "PROGRAM TOTALS")[0], "\n"))-1]), "%d", &tot)
		fmt.Printf("quota %v: %s\n", quota, strings.TrimSpace(strings.Split(strings.Split(string(a), "PROGRAM TOTALS")[0], "\n")[len(strings.Split(strings.Split(string(a), "PROGRAM TOTALS")[0], "\n"))-1]))
	}
}
