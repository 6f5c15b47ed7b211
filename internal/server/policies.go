package server

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/config"
)

type policySet struct {
	limits   config.Policies
	limiters map[string]*ratelimit.Limiter[string]
}

// SetPolicies replaces the namespaces and their limits. The set must hold
// config.DefaultNamespace and every namespace pinned by Pin, and no name
// beginning with config.ReservedPrefix (an Envoy rule's); otherwise the old
// set stays and the error says why.
func (s *Service) SetPolicies(p config.Policies) error {
	if _, ok := p[config.DefaultNamespace]; !ok {
		return fmt.Errorf("namespace %q is missing", config.DefaultNamespace)
	}
	if pinned := s.pinned.Load(); pinned != nil {
		for _, ns := range *pinned {
			if _, ok := p[ns]; !ok {
				return fmt.Errorf("namespace %q limits the proxied requests and cannot be removed", ns)
			}
		}
	}
	set := &policySet{limits: make(config.Policies, len(p)), limiters: make(map[string]*ratelimit.Limiter[string], len(p))}
	for ns, pol := range p {
		if err := reservedName(ns); err != nil {
			return fmt.Errorf("namespace %q: %w", ns, err)
		}
		opts := []ratelimit.Option{ratelimit.WithNamespace(ns), ratelimit.WithObserver(s.metrics.observer, s.stats)}
		if s.clock != nil {
			opts = append(opts, ratelimit.WithClock(s.clock))
		}
		lim, err := ratelimit.NewMulti[string](s.store, pol.Limits(), append(opts, pol.Options()...)...)
		if err != nil {
			return fmt.Errorf("namespace %q: %w", ns, err)
		}
		set.limits[ns] = pol
		set.limiters[ns] = lim
	}
	s.policies.Store(set)
	s.metrics.namespaces.Set(float64(len(set.limits)))
	return nil
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
