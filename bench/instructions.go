package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/redis/go-redis/v9"
)

// The instructions section counts the instructions redis-server executes per
// decision of our script, run as the function it ships as (FCALL), under
// valgrind's callgrind, which does not depend
// on the machine's load: one PerSecond(rate) limit, 1,000 cycling subjects,
// calls of K keys in mode "each" on the server's TIME, one connection. It
// runs the server twice per K, for few and for many calls, and divides the
// difference by the extra decisions, so that start-up and the first calls
// cancel out. It is not in the default sections: it needs valgrind and takes
// minutes.

// instructionCount is the result for one K.
type instructionCount struct {
	k     int
	perOp float64
}

const (
	instrFew, instrMany = 1000, 5000 // calls of the two runs
	instrSubjects       = 1000
)

// instrScript is what the instructions section runs: our script (by FCALL,
// or with eval by EVALSHA of its body; with quota, its policy has a monthly
// quota), or the skeleton by EVALSHA, one key a call.
type instrScript struct {
	quota, eval, skeleton bool
}

func measureInstructions(ctx context.Context, p policy, ks []int, s instrScript) ([]instructionCount, error) {
	var out []instructionCount
	for _, k := range ks {
		perOp, err := instructionsPerDecision(ctx, p, k, s)
		if err != nil {
			return nil, err
		}
		out = append(out, instructionCount{k: k, perOp: perOp})
	}
	return out, nil
}

// instructionsPerDecision runs s twice, for few and for many calls of k keys,
// and returns the difference of their instructions per extra decision.
func instructionsPerDecision(ctx context.Context, p policy, k int, s instrScript) (float64, error) {
	few, err := callgrindRun(ctx, p, k, instrFew, s)
	if err != nil {
		return 0, err
	}
	many, err := callgrindRun(ctx, p, k, instrMany, s)
	if err != nil {
		return 0, err
	}
	return float64(many-few) / float64((instrMany-instrFew)*k), nil
}

// callgrindRun starts redis-server under callgrind, sends calls calls of s
// of k keys (ours by FCALL, or with s.eval by EVALSHA of the script's body,
// as redisstore calls a server without functions; the skeleton by EVALSHA,
// k 1), stops it and returns the instructions it executed.
func callgrindRun(ctx context.Context, p policy, k, calls int, s instrScript) (int64, error) {
	vg, err := findBinary("valgrind")
	if err != nil {
		return 0, fmt.Errorf("%w (apt-get install valgrind)", err)
	}
	rs, err := findBinary("redis-server")
	if err != nil {
		return 0, err
	}
	port, err := freePort()
	if err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "ratelimit-callgrind-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	outFile := filepath.Join(dir, "callgrind.out")
	cmd := exec.Command(vg, "--tool=callgrind", "--callgrind-out-file="+outFile, rs,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer cmd.Process.Kill()
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1, PoolSize: 1,
		ReadTimeout: time.Minute, WriteTimeout: time.Minute, DisableIdentity: true})
	defer c.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for c.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("redis-server under valgrind did not answer within 2 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := c.FunctionLoad(ctx, script.Library).Err(); err != nil {
		return 0, err
	}
	if err := c.ScriptLoad(ctx, script.Source).Err(); err != nil {
		return 0, err
	}
	if err := c.ScriptLoad(ctx, SkeletonScript).Err(); err != nil {
		return 0, err
	}
	r := ratelimit.Request{Limits: []ratelimit.Limit{ourLimit(env{policy: p})}, Cost: 1}
	if s.quota {
		r.Quotas = []ratelimit.Quota{ratelimit.CalendarQuota(1<<50, ratelimit.Month, nil)}
	}
	var enc script.Encoder
	keys := make([]string, k)
	for i := range calls {
		args := script.CallArgs(r, script.Each, k)
		for j := range k {
			keys[j] = fmt.Sprintf("ic:%d", (i*k+j)%instrSubjects)
			args = enc.AppendRequest(args, r)
		}
		if s.quota && k > 1 {
			args = append(args, int64(script.ReplyLen+2*2)) // the reply's width: two parts
		}
		var err error
		switch {
		case s.skeleton:
			err = c.EvalSha(ctx, skeletonSHA, keys[:1], skeletonPX(p)).Err()
		case s.eval:
			err = c.EvalSha(ctx, script.SHA, keys, args...).Err()
		default:
			err = c.FCall(ctx, script.Function, keys, args...).Err()
		}
		if err != nil {
			return 0, err
		}
	}
	c.Shutdown(ctx) // ends the connection: its error is expected
	if err := cmd.Wait(); err != nil {
		return 0, fmt.Errorf("redis-server under valgrind: %w", err)
	}
	f, err := os.Open(outFile)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "summary: "); ok {
			return strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("no summary line in %s", outFile)
}
