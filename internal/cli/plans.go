package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/server"
)

const assignAbout = `
assign sets a subject's plan in a namespace of plans, in Redis, where every
'ratelimit serve --redis' sharing it finds it (within its refresh interval,
500 ms by default): the same assignment POST /v1/assign makes. --plan ""
removes the assignment, so that the namespace's default plan applies. It
needs the service's --config file, which defines the namespace's plans, and
prints the assignment, with the plan it replaced.`

const usageAbout = `
usage shows a subject's plan in a namespace of plans, and the standing of
each limit and quota of its policy, without taking anything (a peek under
its plan): what POST /v1/usage answers. In a namespace of limits of its own
it shows the standing alone. It needs the service's --config file.`

// planFlags are the flags of assign and usage.
type planFlags struct {
	rf          redisFlags
	ns, cfg     string
	subject     string
	asJSON      bool
	timeout     time.Duration
	policies    config.Policies
	usageArgs   string
	commandName string
}

// register adds the flags common to assign and usage to fs.
func (f *planFlags) register(fs *flagSet) {
	f.rf.register(fs)
	fs.StringVar(&f.ns, "namespace", config.DefaultNamespace, "the subject's `namespace`")
	fs.StringVar(&f.subject, "subject", "", "the `SUBJECT`")
	fs.StringVar(&f.cfg, "config", "", "YAML `FILE` of namespaces and plans, as given to serve")
	fs.BoolVar(&f.asJSON, "json", false, "print the service's JSON answer")
	fs.DurationVar(&f.timeout, "timeout", 2*time.Second, "bound on the calls to Redis")
}

// check checks the flags after parsing and loads the policies; pos are
// the positional arguments.
func (f *planFlags) check(pos []string) error {
	switch {
	case len(pos) > 0:
		return usagef("no arguments expected, got %q (usage: ratelimit %s %s)", pos, f.commandName, f.usageArgs)
	case f.subject == "":
		return usagef("--subject is required (usage: ratelimit %s %s)", f.commandName, f.usageArgs)
	case len(f.rf.urls) == 0:
		return usagef("--redis URL is required: the embedded store lives inside 'ratelimit serve'")
	case f.timeout <= 0:
		return usagef("--timeout must be positive (got %v)", f.timeout)
	case f.cfg == "":
		return usagef("--config FILE is required: the service's file, which defines the plans")
	}
	var err error
	if f.policies, err = config.Load(f.cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if _, ok := f.policies[f.ns]; !ok {
		return usagef("unknown namespace %q (known: %v)", f.ns, f.policies.Names())
	}
	return nil
}

func runAssign(ctx context.Context, env Env, args []string) error {
	f := planFlags{commandName: "assign", usageArgs: "--redis URL --config FILE --namespace NS --subject SUBJECT --plan PLAN"}
	var plan string
	fs := newFlagSet(env, "assign", f.usageArgs, assignAbout)
	f.register(fs)
	fs.StringVar(&plan, "plan", "", "the `PLAN` to assign, one the namespace offers; \"\" removes the assignment")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	given := false
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "plan" {
			given = true
		}
	})
	if !given {
		return usagef(`--plan is required: a plan the namespace offers, or "" to remove the assignment`)
	}
	if err := f.check(pos); err != nil {
		return err
	}
	pol := f.policies[f.ns]
	if !pol.HasPlans() {
		return usagef("namespace %q offers no plans: assign in a namespace of plans", f.ns)
	}
	st, err := openStore(storeOptions{redis: f.rf})
	if err != nil {
		return err
	}
	defer st.close()
	plans, err := ratelimit.NewPlans[string](st.store, pol.LibraryPlans(), pol.DefaultPlan, ratelimit.WithNamespace(f.ns))
	if err != nil {
		return err
	}
	defer plans.Close()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	old, err := plans.Assign(ctx, f.subject, ratelimit.Assignment{Plan: plan})
	switch {
	case errors.Is(err, ratelimit.ErrInvalidArgument):
		return usageError{err}
	case err != nil:
		return fmt.Errorf("%s: %w", st.name, err)
	}
	if f.asJSON {
		return json.NewEncoder(env.Stdout).Encode(server.Assigned{Namespace: f.ns, Subject: f.subject, Plan: plan, Previous: old.Plan})
	}
	now, was := plan, old.Plan
	if now == "" {
		now = "no assignment (the default plan, " + pol.DefaultPlan + ")"
	}
	if was == "" {
		was = "none"
	}
	fmt.Fprintf(env.Stdout, "assigned: %q in namespace %q: %s (was %s)\n", f.subject, f.ns, now, was)
	return nil
}

func runUsage(ctx context.Context, env Env, args []string) error {
	f := planFlags{commandName: "usage", usageArgs: "--redis URL --config FILE --namespace NS --subject SUBJECT"}
	fs := newFlagSet(env, "usage", f.usageArgs, usageAbout)
	f.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := f.check(pos); err != nil {
		return err
	}
	st, err := openStore(storeOptions{redis: f.rf})
	if err != nil {
		return err
	}
	defer st.close()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	sl, err := subjectLimiter(ctx, st.store, f.ns, f.policies[f.ns], f.subject)
	if err != nil {
		return fmt.Errorf("%s: %w", st.name, err)
	}
	defer sl.close()
	d, err := sl.lim.Peek(ctx, f.subject)
	if err != nil {
		return fmt.Errorf("%s: %w", st.name, err)
	}
	out := server.NewDecision(f.ns, f.subject, 0, d, sl.pol)
	out.Plan = sl.plan
	if f.asJSON {
		return json.NewEncoder(env.Stdout).Encode(out)
	}
	if sl.plans {
		plan := sl.plan
		if plan == "" {
			plan = "a policy of its own"
		}
		fmt.Fprintf(env.Stdout, "plan: %s\n", plan)
	}
	for _, s := range out.Limits {
		what := s.Kind
		if s.Kind == "quota" {
			what = fmt.Sprintf("quota of a %s in %s, of %s", s.Period, s.TimeZone, s.Counts)
		}
		fmt.Fprintf(env.Stdout, "%s: %d of %d left, %s in %v\n", what, s.Remaining, s.Limit, resetWord(s.Kind), roundWait(time.Duration(s.ResetAfterMs)*time.Millisecond))
	}
	return nil
}

// resetWord is what happens at a standing's reset: a bucket is full, a
// quota's window ends.
func resetWord(kind string) string {
	if kind == "quota" {
		return "the window ends"
	}
	return "full"
}

// subject is the Limiter a subject is checked with in a namespace, and the
// policy and plan it stands for.
type subject struct {
	plans bool   // the namespace offers plans
	plan  string // its plan: "" outside plans, or for a policy of its own
	pol   config.Policy
	lim   *ratelimit.Limiter[string]
	close func()
}

// subjectLimiter returns the Limiter subj is checked with in namespace ns
// of policy pol: pol's own; in a namespace of plans, its plan's, from the
// store's assignments as ratelimit.Plans reads them (Refresh, then For).
// close releases what it opened.
func subjectLimiter(ctx context.Context, store ratelimit.Store, ns string, pol config.Policy, subj string) (subject, error) {
	if !pol.HasPlans() {
		lim, err := ratelimit.NewMulti[string](store, pol.Limits(), append(pol.Options(), ratelimit.WithNamespace(ns))...)
		return subject{pol: pol, lim: lim, close: func() {}}, err
	}
	plans, err := ratelimit.NewPlans[string](store, pol.LibraryPlans(), pol.DefaultPlan, ratelimit.WithNamespace(ns))
	if err != nil {
		return subject{}, err
	}
	if err := plans.Refresh(ctx); err != nil {
		plans.Close()
		return subject{}, err
	}
	plan, lim := plans.For(subj)
	s := subject{plans: true, plan: plan, lim: lim, close: plans.Close}
	if p, ok := pol.Plan(plan); ok {
		s.pol = p
	} else {
		s.pol = config.OwnPolicy(lim.Limits(), lim.Quotas())
	}
	return s, nil
}
