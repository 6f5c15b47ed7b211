package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/config"
)

type policySet struct {
	limits config.Policies
	// limiters are the Limiters of the namespaces of limits of their own,
	// plans the Plans of the namespaces of plans: each namespace is in one.
	limiters map[string]*ratelimit.Limiter[string]
	plans    map[string]*ratelimit.Plans[string]
}

// has reports whether the set holds namespace ns.
func (set *policySet) has(ns string) bool {
	_, ok := set.limits[ns]
	return ok
}

// close stops the watchers of the set's Plans.
func (set *policySet) close() {
	for _, p := range set.plans {
		p.Close()
	}
}

// errClosed is SetPolicies's error after Close.
var errClosed = errors.New("server: the service is closed")

// SetPolicies replaces the namespaces and their limits. The set must hold
// config.DefaultNamespace and every namespace pinned by Pin (none of them
// a namespace of plans), and no name beginning with config.ReservedPrefix
// (an Envoy rule's); otherwise the old set stays and the error says why.
//
// A namespace of plans is served by a ratelimit.Plans on the service's
// store, whose assignments SetPolicies reads once (bounded by the check
// timeout; a store that does not answer leaves it to the watcher) before
// the set is put in force; the Plans of the set replaced are closed.
func (s *Service) SetPolicies(p config.Policies) error {
	if _, ok := p[config.DefaultNamespace]; !ok {
		return fmt.Errorf("namespace %q is missing", config.DefaultNamespace)
	}
	if pinned := s.pinned.Load(); pinned != nil {
		for _, ns := range *pinned {
			if _, ok := p[ns]; !ok {
				return fmt.Errorf("namespace %q limits the proxied requests and cannot be removed", ns)
			}
			if p[ns].HasPlans() {
				return fmt.Errorf("namespace %q limits the proxied requests and cannot offer plans: the proxy takes a namespace of limits of its own", ns)
			}
		}
	}
	set := &policySet{limits: make(config.Policies, len(p)), limiters: make(map[string]*ratelimit.Limiter[string], len(p)), plans: map[string]*ratelimit.Plans[string]{}}
	for ns, pol := range p {
		if err := reservedName(ns); err != nil {
			set.close()
			return fmt.Errorf("namespace %q: %w", ns, err)
		}
		opts := []ratelimit.Option{ratelimit.WithNamespace(ns), ratelimit.WithObserver(s.metrics.observer, s.stats)}
		if s.clock != nil {
			opts = append(opts, ratelimit.WithClock(s.clock))
		}
		var err error
		if pol.HasPlans() {
			if s.planRefresh > 0 {
				opts = append(opts, ratelimit.WithPlanRefresh(s.planRefresh))
			}
			set.plans[ns], err = ratelimit.NewPlans[string](s.store, pol.LibraryPlans(), pol.DefaultPlan, opts...)
		} else {
			set.limiters[ns], err = ratelimit.NewMulti[string](s.store, pol.Limits(), append(opts, pol.Options()...)...)
		}
		if err != nil {
			set.close()
			return fmt.Errorf("namespace %q: %w", ns, err)
		}
		set.limits[ns] = pol
	}
	for ns, plans := range set.plans {
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		if err := plans.Refresh(ctx); err != nil && !errors.Is(err, errors.ErrUnsupported) {
			s.log.Warn("the assignments of a namespace of plans could not be read; its subjects have the default plan until the watcher reads them", "namespace", ns, "err", err)
		}
		cancel()
	}
	s.setMu.Lock()
	defer s.setMu.Unlock()
	if s.closed {
		set.close()
		return errClosed
	}
	if old := s.policies.Swap(set); old != nil {
		old.close()
	}
	s.metrics.namespaces.Set(float64(len(set.limits)))
	return nil
}

// Close stops the watchers of the assignments of the namespaces of plans.
// The API keeps answering, with the assignments last seen; a later
// SetPolicies is refused. Close may be called more than once.
func (s *Service) Close() {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	s.closed = true
	if set := s.policies.Load(); set != nil {
		set.close()
	}
}

// Policies returns the namespaces in force.
func (s *Service) Policies() config.Policies {
	out := make(config.Policies)
	for k, v := range s.policies.Load().limits {
		out[k] = v
	}
	return out
}

// Reload loads the policies from the file at path and puts them in force.
// On any error the policies in force stay, and the error says why; it is
// also logged, with the file and the namespaces kept, and counted in
// ratelimit_config_reloads_total{result="error"}. The outcome is in
// /v1/stats either way.
func (s *Service) Reload(path string) error {
	p, err := config.Load(path)
	old := s.policies.Load().limits
	if err == nil {
		err = s.SetPolicies(p)
	}
	s.stats.RecordReload(path, err)
	if err != nil {
		s.metrics.reloads.WithLabelValues("error").Inc()
		s.log.Error("config reload refused; keeping the previous policies",
			"file", path, "err", err, "policies", s.policies.Load().limits.String())
		return err
	}
	s.metrics.reloads.WithLabelValues("ok").Inc()
	attrs := []any{"file", path, "policies", p.String()}
	if removed := removedNames(old, p); len(removed) > 0 {
		attrs = append(attrs, "removed", strings.Join(removed, ","))
	}
	s.log.Info("config reloaded", attrs...)
	return nil
}

// Pin makes namespaces required: SetPolicies refuses a set without them.
// The proxy pins the namespace it limits requests with.
func (s *Service) Pin(namespaces ...string) error {
	set := s.policies.Load()
	for _, ns := range namespaces {
		if _, ok := set.limits[ns]; !ok {
			return fmt.Errorf("unknown namespace %q (known: %s)", ns, knownNames(set))
		}
		if set.limits[ns].HasPlans() {
			return fmt.Errorf("namespace %q offers plans: the proxy takes a namespace of limits of its own", ns)
		}
	}
	old := s.pinned.Load()
	var all []string
	if old != nil {
		all = append(all, *old...)
	}
	all = append(all, namespaces...)
	s.pinned.Store(&all)
	return nil
}

// reservedName returns a *config.ReservedError when ns is named like an
// Envoy rule's namespace, else nil: such a namespace would share the rule's
// buckets, and a reset of it would reset them.
func reservedName(ns string) error {
	var reserved *config.ReservedError
	if err := config.CheckName(ns); errors.As(err, &reserved) {
		return err
	}
	return nil
}

// removedNames returns the namespaces of old that next lacks, sorted.
func removedNames(old, next config.Policies) []string {
	var out []string
	for _, n := range old.Names() {
		if _, ok := next[n]; !ok {
			out = append(out, n)
		}
	}
	return out
}

func knownNames(set *policySet) string {
	names := set.limits.Names()
	if len(names) > 10 {
		names = append(slices.Clip(names[:10]), "...")
	}
	return strings.Join(names, ", ")
}

// serveConfig is GET /v1/config: the namespaces and limits in force, the
// store (without credentials), the check timeout and the outage behaviour.
// It needs the bearer token as the rest of /v1/ does.
func (s *Service) serveConfig(w http.ResponseWriter, r *http.Request) {
	const path = "/v1/config"
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		s.fail(w, path, http.StatusMethodNotAllowed, path+" wants GET")
		return
	}
	if !s.authorized(r) {
		s.unauthorized(w, r, path)
		return
	}
	set := s.policies.Load()
	ns := make(map[string]config.PolicyJSON, len(set.limits))
	for name, pol := range set.limits {
		ns[name] = pol.JSON()
	}
	out := map[string]any{
		"namespaces": ns,
		"store":      s.name,
		"timeout":    s.timeout.String(),
		"version":    s.version,
	}
	if s.hasOutage {
		out["outage"] = s.outage.String()
	}
	s.reply(w, path, http.StatusOK, out)
}
