package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/server"
)

const bucketAbout = `
%s operates on one subject's bucket in Redis, the buckets 'ratelimit serve
--redis' keeps: the same namespace and subject name the same key.

acquire and peek need the namespace's limit: the built-in "default" (10 per
second, bursting to 10), or the one --config gives it. Use the file the
service runs with: a check under another limit changes the bucket's policy.
In a namespace of plans, acquire and peek check under the subject's plan,
as the store's assignments give it (see 'ratelimit assign').
reset needs none. The decision is printed as a line, or with --json as the
service's JSON; a denial is not an error (exit status 0).`

func runBucket(op string) func(ctx context.Context, env Env, args []string) error {
	return func(ctx context.Context, env Env, args []string) error {
		var (
			rf        redisFlags
			ns, cfg   string
			cost      int64
			asJSON    bool
			timeout   time.Duration
			usageArgs = "--redis URL [flags] SUBJECT"
		)
		fs := newFlagSet(env, op, usageArgs, fmt.Sprintf(bucketAbout, op))
		rf.register(fs)
		fs.StringVar(&ns, "namespace", config.DefaultNamespace, "the subject's `namespace`")
		fs.StringVar(&cfg, "config", "", "YAML `FILE` of namespaces, as given to serve")
		if op == "acquire" {
			fs.Int64Var(&cost, "cost", 1, "tokens to take")
		}
		fs.BoolVar(&asJSON, "json", false, "print the decision as JSON")
		fs.DurationVar(&timeout, "timeout", 2*time.Second, "bound on the call to Redis")
		pos, err := parse(fs, args)
		if err != nil {
			return err
		}
		switch {
		case len(pos) == 0:
			return usagef("missing SUBJECT (usage: ratelimit %s %s)", op, usageArgs)
		case len(pos) > 1:
			return usagef("one SUBJECT expected, got %d arguments: %q", len(pos), pos)
		case pos[0] == "":
			return usagef("SUBJECT must not be empty")
		case len(rf.urls) == 0:
			return usagef("--redis URL is required: the embedded store lives inside 'ratelimit serve'")
		case timeout <= 0:
			return usagef("--timeout must be positive (got %v)", timeout)
		}
		subject := pos[0]
		policies := config.Default()
		if cfg != "" {
			if policies, err = config.Load(cfg); err != nil {
				return fmt.Errorf("config: %w", err)
			}
		}
		pol, ok := policies[ns]
		switch {
		case ok:
		case op == "reset":
			// A reset deletes the key whatever the policy; any valid
			// limit builds the Limiter.
			if err := config.CheckName(ns); err != nil {
				return usagef("--namespace: %v", err)
			}
			pol = config.Policy{Requests: config.DefaultLimit}
		default:
			return usagef("unknown namespace %q (known: %v); give the service's --config", ns, policies.Names())
		}
		st, err := openStore(storeOptions{redis: rf})
		if err != nil {
			return err
		}
		defer st.close()
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		sl, err := subjectLimiter(ctx, st.store, ns, pol, subject)
		if err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
		defer sl.close()
		lim := sl.lim
		pol = sl.pol
		if op == "acquire" && (cost < 1 || cost > pol.MaxCost()) {
			// (Of the subject's plan, in a namespace of plans.)
			return usagef("--cost must be between 1 and the capacity %d of namespace %q (got %d)", pol.MaxCost(), ns, cost)
		}
		var d ratelimit.Decision
		switch op {
		case "acquire":
			d, err = lim.TryAcquireN(ctx, subject, cost)
		case "peek":
			d, err = lim.Peek(ctx, subject)
			cost = 0
		case "reset":
			err = lim.Reset(ctx, subject)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
		if op == "reset" {
			if asJSON {
				return json.NewEncoder(env.Stdout).Encode(map[string]any{"namespace": ns, "subject": subject, "reset": true})
			}
			fmt.Fprintf(env.Stdout, "reset: the bucket of %q in namespace %q is deleted; its next check starts full\n", subject, ns)
			return nil
		}
		if asJSON {
			out := server.NewDecision(ns, subject, cost, d, pol)
			out.Plan = sl.plan
			return json.NewEncoder(env.Stdout).Encode(out)
		}
		fmt.Fprintln(env.Stdout, formatDecision(d))
		return nil
	}
}

// formatDecision is a decision as one line for a shell:
// "allowed: 9 of 10 tokens left, full in 100ms".
func formatDecision(d ratelimit.Decision) string {
	s := fmt.Sprintf("%d of %d tokens left", d.Remaining, d.Limit.Capacity)
	if d.Allowed {
		return fmt.Sprintf("allowed: %s, full in %v", s, roundWait(d.ResetAfter))
	}
	return fmt.Sprintf("denied: %s, retry in %v, full in %v", s, roundWait(d.RetryAfter), roundWait(d.ResetAfter))
}

// roundWait rounds a wait to three significant digits or so, for reading.
func roundWait(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}
