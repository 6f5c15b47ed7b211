package operator

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/exactlimit/ratelimit/internal/config"
)

// mastersTimeout bounds Source.Masters in one report.
const mastersTimeout = 300 * time.Millisecond

// Report is the JSON of GET /v1/stats: the operator page's figures.
type Report struct {
	// Time is the time of the report, on the Stats clock.
	Time time.Time `json:"time"`
	// Started is when the Stats began counting.
	Started    time.Time         `json:"started"`
	Store      StoreReport       `json:"store"`
	Reload     *ReloadReport     `json:"reload"` // null before the first reload
	Namespaces []NamespaceReport `json:"namespaces"`
	// TopDenied is null unless the service keeps the most denied subjects
	// (StatsOptions.TopDenied).
	TopDenied *TopDeniedReport `json:"top_denied"`
}

// StoreReport is the state of the store.
type StoreReport struct {
	// Kind is StoreEmbedded, StoreRedis or StoreCluster ("" when
	// unknown).
	Kind string `json:"kind"`
	// Name describes the store, as /healthz does.
	Name string `json:"name"`
	// PrimaryUp is false while the store serves without its primary (with
	// Cluster, without one of its masters).
	PrimaryUp bool `json:"primary_up"`
	// Outage is the behaviour that decides while the primary is down:
	// "local-fallback", "fail-open", "fail-closed" or "return-error"; ""
	// for the embedded store, which has no outage.
	Outage string `json:"outage"`
	// Since is the time of the primary's last change of state, absent
	// when it has not changed since start.
	Since *time.Time `json:"since,omitempty"`
	// Error is why the primary was marked down, while it is.
	Error string `json:"error,omitempty"`
	// Outages counts the outages of the primary that ended since start.
	Outages int `json:"outages"`
	// Masters are a Cluster's masters, by address.
	Masters []MasterReport `json:"masters,omitempty"`
	// MastersError says why the masters could not be listed.
	MastersError string `json:"masters_error,omitempty"`
}

// MasterReport is the state of one Cluster master.
type MasterReport struct {
	// Addr is the master's host:port.
	Addr string `json:"addr"`
	// Up is false while the master is marked down: its subjects get the
	// outage behaviour.
	Up bool `json:"up"`
	// Since is the time of its last change of state, absent when it has
	// not changed since start.
	Since *time.Time `json:"since,omitempty"`
	// Error is why it was marked down, while it is.
	Error string `json:"error,omitempty"`
}

// ReloadReport is the outcome of the last config reload (SIGHUP).
type ReloadReport struct {
	File string    `json:"file"`
	At   time.Time `json:"at"`
	// Result is "ok", or "refused" when the file was bad and the previous
	// policies stayed.
	Result string `json:"result"`
	Error  string `json:"error,omitempty"`
}

// EnvoyDomain is a domain of Envoy's rate limit service (Source.Envoy).
type EnvoyDomain struct {
	// Name is the namespace its decisions are observed under.
	Name string
	// Domain is the domain as configured, and Rules the number of its
	// rules.
	Domain string
	Rules  int
}

// NamespaceReport are the figures of one namespace in force, or of one
// domain of Envoy's rate limit service.
type NamespaceReport struct {
	Name string `json:"name"`
	// Policy is the namespace's limits; zero for an Envoy domain, whose
	// rules each have their own.
	Policy config.PolicyJSON `json:"policy"`
	// Envoy is set for a domain of Envoy's rate limit service.
	Envoy *EnvoyReport `json:"envoy,omitempty"`
	// Allowed and Denied count the acquires decided since start, whatever
	// decided them (the sum of ratelimit_decisions_total{op="acquire"}
	// over its sources). Peeks are not counted.
	Allowed uint64 `json:"allowed"`
	Denied  uint64 `json:"denied"`
	// Errors counts the checks that could not be decided.
	Errors uint64 `json:"errors"`
	// DecisionsPerSecond is the rate of acquires over the last RateStep
	// and the step in progress.
	DecisionsPerSecond float64       `json:"decisions_per_second"`
	Rate               RateReport    `json:"rate"`
	Latency            LatencyReport `json:"latency"`
}

// EnvoyReport says which domain of Envoy's rate limit service a
// NamespaceReport is.
type EnvoyReport struct {
	Domain string `json:"domain"`
	Rules  int    `json:"rules"`
}

// RateReport is the acquires of each of the last RatePoints whole steps of
// RateStep, oldest first; the step in progress is not in it.
type RateReport struct {
	StepSeconds int64 `json:"step_seconds"`
	// End is the end of the last step.
	End     time.Time `json:"end"`
	Allowed []uint64  `json:"allowed"`
	Denied  []uint64  `json:"denied"`
}

// LatencyReport is the time of the checks (acquires and peeks) of the last
// LatencyWindow, from a histogram with bins at most 20% wide: a percentile is the
// upper bound of its bin.
type LatencyReport struct {
	WindowSeconds int64   `json:"window_seconds"`
	Count         uint64  `json:"count"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
}

// TopDeniedReport are the most denied subjects of the last minutes, from a
// Space-Saving sketch of TopDeniedCounters counters whose counts halve
// every TopDeniedHalfLife.
type TopDeniedReport struct {
	HalfLifeSeconds int64           `json:"half_life_seconds"`
	Counters        int             `json:"counters"`
	Subjects        []DeniedSubject `json:"subjects"`
}

// DeniedSubject is one subject of TopDeniedReport.
type DeniedSubject struct {
	Namespace string `json:"namespace"`
	// Subject is as the client sent it, cut to MaxTopSubjectBytes.
	Subject string `json:"subject"`
	// Denied is the decayed count of denials, an overestimate by at most
	// MaxOvercount.
	Denied       uint64 `json:"denied"`
	MaxOvercount uint64 `json:"max_overcount"`
}

// Source is what a Report tells of the service besides the figures Stats
// keeps: its namespaces, its store and Envoy's domains.
type Source struct {
	// Namespaces are the namespaces in force, with their limits.
	Namespaces config.Policies
	// Store is the store's kind, name, outage behaviour and whether its
	// primary is up; Report adds the rest of StoreReport.
	Store StoreReport
	// Masters lists a Cluster's masters (host:port); it is called with a
	// short deadline. Nil means none.
	Masters func(ctx context.Context) ([]string, error)
	// Envoy lists the domains of Envoy's rate limit service, whose
	// decisions reach Stats under their own namespace (EnvoyDomain.Name);
	// they follow the namespaces, sorted. Nil means none.
	Envoy func() []EnvoyDomain
}

// Report returns the figures of the operator page at the Stats clock's
// now, for the service src describes: per namespace and Envoy domain the
// decisions, their rate and latency; the state of the store, of each
// Cluster master and of the last reload; and the most denied subjects
// (with StatsOptions.TopDenied).
func (st *Stats) Report(ctx context.Context, src Source) Report {
	now := st.clock()
	r := Report{Time: now, Started: st.started, Namespaces: []NamespaceReport{}}

	for _, name := range src.Namespaces.Names() {
		r.Namespaces = append(r.Namespaces, st.report(name, now, src.Namespaces[name].JSON()))
	}
	if src.Envoy != nil {
		domains := src.Envoy()
		slices.SortFunc(domains, func(a, b EnvoyDomain) int { return strings.Compare(a.Name, b.Name) })
		for _, d := range domains {
			nr := st.report(d.Name, now, config.PolicyJSON{})
			nr.Envoy = &EnvoyReport{Domain: d.Domain, Rules: d.Rules}
			r.Namespaces = append(r.Namespaces, nr)
		}
	}

	r.Store = src.Store
	var masters []string
	if src.Masters != nil {
		mctx, cancel := context.WithTimeout(ctx, mastersTimeout)
		var err error
		masters, err = src.Masters(mctx)
		cancel()
		if err != nil {
			r.Store.MastersError = err.Error()
		}
	}

	st.mu.Lock()
	for name, p := range st.parts {
		if name == "" {
			since := p.since
			r.Store.Since = &since
			r.Store.Error = p.cause
		} else if !slices.Contains(masters, name) {
			masters = append(masters, name)
		}
		r.Store.Outages += p.outages
	}
	slices.Sort(masters)
	for _, addr := range masters {
		m := MasterReport{Addr: addr, Up: true}
		if p := st.parts[addr]; p != nil {
			since := p.since
			m.Up, m.Since, m.Error = p.up, &since, p.cause
		}
		r.Store.Masters = append(r.Store.Masters, m)
	}
	if rl := st.reload; rl != nil {
		r.Reload = &ReloadReport{File: rl.file, At: rl.at, Result: "ok", Error: rl.err}
		if !rl.ok {
			r.Reload.Result = "refused"
		}
	}
	if st.top != nil {
		r.TopDenied = &TopDeniedReport{
			HalfLifeSeconds: halfLifeSecs,
			Counters:        TopDeniedCounters,
			Subjects:        []DeniedSubject{},
		}
		for _, c := range st.top.top(TopDeniedShown, now.Unix()/halfLifeSecs) {
			r.TopDenied.Subjects = append(r.TopDenied.Subjects, DeniedSubject{c.namespace, c.subject, c.count, c.err})
		}
	}
	st.mu.Unlock()
	return r
}

// report returns the figures of namespace name at now, under policy.
func (st *Stats) report(name string, now time.Time, policy config.PolicyJSON) NamespaceReport {
	step := now.Unix() / stepSeconds
	ns := st.lookup(name)
	allowed, denied := ns.rate.counts(step-1, RatePoints)
	curAllowed, curDenied := ns.rate.counts(step, 1)
	// The rate over the last whole step and the one in progress, or
	// since start when that is shorter.
	stepStart := time.Unix(step*stepSeconds, 0)
	span := min(now.Sub(stepStart)+RateStep, now.Sub(st.started))
	var perSecond float64
	if span > 0 {
		n := allowed[RatePoints-1] + denied[RatePoints-1] + curAllowed[0] + curDenied[0]
		perSecond = float64(n) / span.Seconds()
	}
	bins, total := ns.latency.histogram(step)
	return NamespaceReport{
		Name:               name,
		Policy:             policy,
		Allowed:            ns.allowed.Load(),
		Denied:             ns.denied.Load(),
		Errors:             ns.errors.Load(),
		DecisionsPerSecond: perSecond,
		Rate:               RateReport{StepSeconds: stepSeconds, End: stepStart.UTC(), Allowed: allowed, Denied: denied},
		Latency: LatencyReport{
			WindowSeconds: int64(LatencyWindow / time.Second),
			Count:         total,
			P50Ms:         millis(checkLatency.Quantile(bins[:], total, 0.50)),
			P99Ms:         millis(checkLatency.Quantile(bins[:], total, 0.99)),
		},
	}
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
