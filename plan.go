package ratelimit

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Plan is a named policy that subjects are assigned to (see Plans): "free",
// 3 a minute; "pro", 50 a minute and 100,000 a month.
type Plan struct {
	// Name names the plan: 1 to 64 letters, digits, '.', '_' and '-'.
	Name string
	// Limits and Quotas are the plan's policy, as NewMulti and WithQuotas
	// take them: at least one limit, at most 8 limits and quotas in all.
	Limits []Limit
	Quotas []Quota
}

// Assignment is a subject's plan as the store keeps it: the name of a plan
// (Plan), or, with Plan "", a policy of the subject's own (Limits and
// Quotas: "acme, 500 a second") that no plan defines. The zero Assignment
// means none: the default plan applies.
type Assignment struct {
	Plan   string
	Limits []Limit
	Quotas []Quota
}

// isZero reports whether a is no assignment.
func (a Assignment) isZero() bool {
	return a.Plan == "" && len(a.Limits) == 0 && len(a.Quotas) == 0
}

// defaultPlanRefresh is how often a Plans asks the store for the changes of
// its assignments, without WithPlanRefresh.
const defaultPlanRefresh = 500 * time.Millisecond

// WithPlanRefresh sets how often NewPlans's watcher asks the store for the
// changes of the assignments: every d, from 1 ms to 1 s (default
// 500 ms). A process applies another's change within d plus
// one round trip. Only NewPlans reads it.
func WithPlanRefresh(d time.Duration) Option {
	return func(o *options) {
		if d < time.Millisecond || d > time.Second {
			o.errs = append(o.errs, invalid("plan refresh must be between 1ms and 1s (got %v)", d))
			return
		}
		o.planRefresh = d
	}
}

// Plans chooses each subject's policy at run time: it offers named plans, a
// default plan, and each subject's assignment, which the store keeps (see
// Assigner), so that every process sharing the store gives a subject the
// same plan. A Go program checks a subject with the Limiter that For gives
// (its assignment's), or with a plan of its choosing (Plan).
//
// Every plan, and every policy of a subject's own, has a Limiter on the one
// namespace of NewPlans's options, so a subject's bucket is one key
// whatever its plan. A check under a new plan carries the bucket over, as
// any change of policy does (see tokenbucket's State.Step): the time since
// the bucket's last write is credited at the old plan's rate, then the
// subject keeps the lesser of its whole tokens and the new capacity (and
// the part of a token it had, below the capacity); a full bucket is a
// missing one, so it starts full at the new capacity. A quota keeps what its
// window used when the new plan has a quota of the same window (a monthly
// quota of another allowance, say), and starts from nothing otherwise. The
// check that carries the bucket over writes it, allowed or denied, so that
// it refills at the new plan's rate from then on. Each check is still
// one atomic decision, exact, all or nothing: the plan only chooses the
// policy it sends. Decision.Converted tells the first check after a change.
//
// For reads the assignments as this process last saw them, without I/O.
// NewPlans starts one goroutine that asks the store for the changes every
// refresh interval (WithPlanRefresh; Close stops it), so a change made by
// any process is applied by every process that reaches the store within the
// interval plus one round trip: 500 ms and a round trip by default, at
// most one second and a round trip. Assign applies its own change here at
// once. A full listing (the first refresh, or one after the store's log of
// changes no longer holds the last change seen) takes a round trip per
// 1,000 assignments on Redis, and must end within 10 s, as every refresh
// of the watcher must. A process that cannot reach the store keeps
// the view it last had; its checks follow the store's outage behaviour
// anyway. Until the first refresh, which starts at once, every subject has
// the default plan: call Refresh to wait for it.
//
// A Plans is safe for simultaneous use by multiple goroutines.
type Plans[K ~string] struct {
	assigner Assigner // nil: the store keeps no assignments
	store    Store
	ns       string
	opts     []Option
	byName   map[string]*Limiter[K]
	names    []string // in NewPlans's order, for errors
	defName  string
	def      *Limiter[K]
	custom   customLimiters[K]

	view   sync.Map   // subject -> viewEntry: the assignments last seen
	mu     sync.Mutex // one refresh at a time: guards cursor and writes to view
	cursor string     // the store's, after the changes view holds

	stop    context.CancelFunc // ends the watcher, and its refresh in flight
	done    chan struct{}      // closed when the watcher has ended
	closing sync.Once
}

// refreshTimeout bounds each of the watcher's refreshes: a store that does
// not answer within it is asked again at the next interval. A full listing
// of a large set (a round trip per 1,000 assignments on Redis) fits in it.
const refreshTimeout = 10 * time.Second

// viewEntry is a subject's assignment as For uses it.
type viewEntry struct {
	value string     // as the store holds it: the key of a policy of its own
	a     Assignment // decoded
}

// NewPlans returns a Plans that offers plans, and defaultPlan (one of them)
// to every subject without an assignment. opts apply to every plan's
// Limiter (WithNamespace, WithClock, WithObserver, WithDenyCache), and
// WithPlanRefresh sets the watcher's interval; a plan's quotas are its
// Quotas, not WithQuotas, and leases (WithLeases) are not offered with
// plans. It checks every plan (a unique name, a valid policy) before any
// store call, and refuses what is invalid with an error wrapping
// ErrInvalidArgument. When store is an Assigner it starts the watcher (see
// Plans); otherwise no subject has an assignment, Assign returns an error
// wrapping errors.ErrUnsupported, and For always gives the default plan.
func NewPlans[K ~string](store Store, plans []Plan, defaultPlan string, opts ...Option) (*Plans[K], error) {
	if store == nil {
		return nil, invalid("store must not be nil")
	}
	o := options{namespace: defaultNamespace, planRefresh: defaultPlanRefresh}
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case len(o.errs) > 0:
		return nil, errors.Join(o.errs...)
	case len(o.quotas) > 0:
		return nil, invalid("a plan's quotas are its Plan.Quotas, not WithQuotas")
	case o.leases > 0:
		return nil, invalid("leases (WithLeases) are not offered with plans")
	case len(plans) == 0:
		return nil, invalid("plans must offer at least one plan")
	}
	p := &Plans[K]{store: store, ns: o.namespace, opts: append([]Option(nil), opts...), byName: make(map[string]*Limiter[K], len(plans))}
	for _, plan := range plans {
		if rule := planNameRule(plan.Name); rule != "" {
			return nil, invalid("%s", rule)
		}
		if p.byName[plan.Name] != nil {
			return nil, invalid("plan %q is defined twice", plan.Name)
		}
		lim, err := p.limiter(plan.Limits, plan.Quotas)
		if err != nil {
			return nil, fmt.Errorf("plan %q: %w", plan.Name, err)
		}
		p.byName[plan.Name] = lim
		p.names = append(p.names, plan.Name)
	}
	if p.def = p.byName[defaultPlan]; p.def == nil {
		return nil, invalid("default plan %q is not one of the plans on offer (%s)", defaultPlan, strings.Join(p.names, ", "))
	}
	p.defName = defaultPlan
	p.assigner, _ = store.(Assigner)
	if p.assigner != nil {
		var ctx context.Context
		ctx, p.stop = context.WithCancel(context.Background())
		p.done = make(chan struct{})
		go p.watch(ctx, o.planRefresh)
	}
	return p, nil
}

// planNameRule returns the rule a plan's name breaks, "" when none.
func planNameRule(name string) string {
	if name == "" || len(name) > 64 {
		return fmt.Sprintf("a plan's name must have 1 to 64 characters (got %d)", len(name))
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Sprintf("a plan's name must be letters, digits, '.', '_' and '-' (got %q)", name)
		}
	}
	return ""
}

// limiter returns a Limiter of limits and quotas on the plans' namespace.
func (p *Plans[K]) limiter(limits []Limit, quotas []Quota) (*Limiter[K], error) {
	return NewEncoded(p.store, encodeString[K], limits, append(p.opts[:len(p.opts):len(p.opts)], WithQuotas(quotas...))...)
}

// Plan returns the Limiter of the plan named name, nil when no plan has
// that name: a program that chooses a subject's plan itself checks with it.
func (p *Plans[K]) Plan(name string) *Limiter[K] { return p.byName[name] }

// For returns subject's plan and its Limiter, from the assignments as this
// process last saw them (see Plans), without I/O: the plan assigned, or the
// default plan when there is no assignment, when the plan assigned is not
// one this Plans offers, or when the assignment could not be read (a
// malformed value). For a policy of the subject's own, plan is "" and lim
// is a Limiter of that policy on the same namespace (this process keeps the
// latest 1,024 of them, and builds another when needed).
func (p *Plans[K]) For(subject K) (plan string, lim *Limiter[K]) {
	v, ok := p.view.Load(string(subject))
	if !ok {
		return p.defName, p.def
	}
	e := v.(*viewEntry)
	if e.a.Plan != "" {
		if lim := p.byName[e.a.Plan]; lim != nil {
			return e.a.Plan, lim
		}
		return p.defName, p.def
	}
	if lim := p.custom.get(e.value, func() (*Limiter[K], error) { return p.limiter(e.a.Limits, e.a.Quotas) }); lim != nil {
		return "", lim
	}
	return p.defName, p.def
}

// Assign sets subject's assignment in the store, for every process that
// shares it: the name of a plan on offer, a policy of its own, or the zero
// Assignment, which removes it (the default plan applies). It returns the
// assignment it replaced (the zero Assignment when there was none, or it
// could not be read). An empty subject, an unknown plan (the error names
// the plans on offer), a plan named beside a policy, an invalid policy, or
// a quota whose time zone another process could not load by name (a
// time.FixedZone, time.Local) is refused with an error wrapping
// ErrInvalidArgument before any store call. A store that keeps no
// assignments gives an error wrapping errors.ErrUnsupported.
//
// This process's view has the change when Assign returns without error
// (Assign refreshes it); every other process applies it within the bound
// Plans states.
func (p *Plans[K]) Assign(ctx context.Context, subject K, a Assignment) (old Assignment, err error) {
	if subject == "" {
		return Assignment{}, invalid("subject must not be empty")
	}
	value, err := p.encode(a)
	if err != nil {
		return Assignment{}, err
	}
	if p.assigner == nil {
		return Assignment{}, fmt.Errorf("ratelimit: the store keeps no assignments (%T is not an Assigner): %w", p.store, errors.ErrUnsupported)
	}
	prev, err := p.assigner.Assign(ctx, p.ns, string(subject), value)
	if err != nil {
		return Assignment{}, err
	}
	p.mu.Lock()
	if _, err := p.refreshLocked(ctx); err != nil {
		// The store has the change; the next refresh brings it again.
		p.set(string(subject), value)
	}
	p.mu.Unlock()
	old, _ = decodeAssignment(prev)
	return old, nil
}

// Assignment returns subject's assignment as the store holds it now (not
// this process's view): the zero Assignment when it has none. A value the
// store holds that is not an assignment is an error.
func (p *Plans[K]) Assignment(ctx context.Context, subject K) (Assignment, error) {
	if subject == "" {
		return Assignment{}, invalid("subject must not be empty")
	}
	if p.assigner == nil {
		return Assignment{}, nil
	}
	v, err := p.assigner.Assigned(ctx, p.ns, string(subject))
	if err != nil {
		return Assignment{}, err
	}
	return decodeAssignment(v)
}

// Refresh brings this process's view of the assignments up to date with
// the store now, as the watcher does every refresh interval: call it after
// NewPlans to start serving with the store's assignments. A store that
// keeps no assignments gives an error wrapping errors.ErrUnsupported; one
// that cannot be reached leaves the view as it was.
func (p *Plans[K]) Refresh(ctx context.Context) error {
	if p.assigner == nil {
		return fmt.Errorf("ratelimit: the store keeps no assignments (%T is not an Assigner): %w", p.store, errors.ErrUnsupported)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.refreshLocked(ctx)
	return err
}

// refreshLocked applies the store's changes since cursor to the view; p.mu
// is held. It reports whether the store listed the whole set.
func (p *Plans[K]) refreshLocked(ctx context.Context) (full bool, err error) {
	changes, next, full, err := p.assigner.AssignmentsSince(ctx, p.ns, p.cursor)
	if err != nil {
		return false, err
	}
	if full {
		p.view.Range(func(k, _ any) bool {
			if _, ok := changes[k.(string)]; !ok {
				p.view.Delete(k)
			}
			return true
		})
	}
	for subject, value := range changes {
		p.set(subject, value)
	}
	p.cursor = next
	return full, nil
}

// set puts subject's assignment, as the store holds it, in the view; p.mu
// is held. A value that is not an assignment is none.
func (p *Plans[K]) set(subject, value string) {
	a, err := decodeAssignment(value)
	if err != nil || a.isZero() {
		p.view.Delete(subject)
		return
	}
	if v, ok := p.view.Load(subject); ok && v.(*viewEntry).value == value {
		return
	}
	p.view.Store(subject, &viewEntry{value: value, a: a})
}

// watch refreshes the view every interval until ctx ends (Close). A store
// that keeps no assignments after all (package fallback over a store that
// keeps none) ends it.
func (p *Plans[K]) watch(ctx context.Context, every time.Duration) {
	defer close(p.done)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, refreshTimeout)
		err := p.Refresh(rctx)
		cancel()
		if errors.Is(err, errors.ErrUnsupported) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Close stops the watcher, ending a refresh in flight, and waits for it to
// end. The Limiters keep working, and For gives the assignments last seen;
// Refresh and Assign still reach the store. Close may be called more than
// once.
func (p *Plans[K]) Close() {
	if p.stop == nil {
		return
	}
	p.closing.Do(p.stop)
	<-p.done
}

// customLimitersSize is the most Limiters of subjects' own policies a Plans
// keeps.
const customLimitersSize = 1024

// customLimiters keeps the Limiters of subjects' own policies, by their
// value as the store holds them, the least recently used going first.
type customLimiters[K ~string] struct {
	mu    sync.Mutex
	byVal map[string]*list.Element // of customLimiter[K]
	order list.List                // most recently used first
}

type customLimiter[K ~string] struct {
	value string
	lim   *Limiter[K]
}

// get returns the Limiter of value, built by build when it is not kept;
// nil when build fails.
func (c *customLimiters[K]) get(value string, build func() (*Limiter[K], error)) *Limiter[K] {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byVal[value]; ok {
		c.order.MoveToFront(el)
		return el.Value.(customLimiter[K]).lim
	}
	lim, err := build()
	if err != nil {
		return nil
	}
	if c.byVal == nil {
		c.byVal = make(map[string]*list.Element)
	}
	if c.order.Len() >= customLimitersSize {
		last := c.order.Back()
		delete(c.byVal, last.Value.(customLimiter[K]).value)
		c.order.Remove(last)
	}
	c.byVal[value] = c.order.PushFront(customLimiter[K]{value: value, lim: lim})
	return lim
}
