package envoyrls

import (
	"errors"
	"fmt"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/units"
)

// maxOverrides bounds the Limiters of descriptors' own limits that a
// Service keeps for reuse; past it, a new limit gets a Limiter per request.
const maxOverrides = 1024

// overrideUnits maps a descriptor's limit unit to its length (envoy.type.v3,
// which has no week).
var overrideUnits = map[typev3.RateLimitUnit]string{
	typev3.RateLimitUnit_SECOND: "second",
	typev3.RateLimitUnit_MINUTE: "minute",
	typev3.RateLimitUnit_HOUR:   "hour",
	typev3.RateLimitUnit_DAY:    "day",
	typev3.RateLimitUnit_MONTH:  "month",
	typev3.RateLimitUnit_YEAR:   "year",
}

// overrideCheck resolves a descriptor that carries its own limit: a bucket of
// requests_per_unit per unit (times unit_multiplier), keyed by the domain,
// the entries and the limit, never in shadow mode.
func (s *Service) overrideCheck(c *check, domain string, d *rlv3.RateLimitDescriptor) error {
	o := d.Limit
	name, ok := overrideUnits[o.Unit]
	if !ok {
		return fmt.Errorf("limit override: unknown unit %v", o.Unit)
	}
	mult := uint32(1)
	if o.UnitMultiplier != nil {
		mult = o.UnitMultiplier.Value
		if mult == 0 {
			return errors.New("limit override: unit_multiplier must be at least 1")
		}
	}
	per := units.Durations[name] * time.Duration(mult)
	if per/time.Duration(mult) != units.Durations[name] {
		return errors.New("limit override: the period overflows")
	}
	var b strings.Builder
	b.WriteString(s.prefix)
	b.WriteString("envoy-override")
	frame(&b, domain)
	fmt.Fprintf(&b, ":%d/%s*%d", o.RequestsPerUnit, name, mult)
	// The statistics key and the policy name hold the entries' keys and
	// never their values: a value can be anything a client sends.
	var subj, stat strings.Builder
	stat.WriteString(domain)
	for _, e := range d.Entries {
		frame(&subj, e.Key)
		frame(&subj, e.Value)
		stat.WriteByte('.')
		stat.WriteString(e.Key)
	}
	stat.WriteString(overrideSuffix)
	r := &Rule{Domain: domain, Path: stat.String(), Unit: name, RequestsPerUnit: o.RequestsPerUnit, Capacity: int64(o.RequestsPerUnit), namespace: b.String(), override: true}
	c.rule, c.subject, c.metric = r, shorten(subj.String()), r.Path
	c.current = &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: o.RequestsPerUnit, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(o.Unit), UnitMultiplier: o.UnitMultiplier}
	if o.RequestsPerUnit == 0 {
		return nil
	}
	l, rounded, err := bucketLimit(r.Capacity, int64(o.RequestsPerUnit), per)
	if err != nil {
		return fmt.Errorf("limit override: %v", err)
	}
	r.limit, r.Rounded = l, rounded
	c.lim, err = s.overrideLimiter(r.namespace, l)
	return err
}

// overrideLimiter returns the Limiter of a descriptor's own limit l, whose
// buckets are in namespace ns: the one built for an earlier request of the
// same namespace, or a new one, kept while fewer than maxOverrides are.
func (s *Service) overrideLimiter(ns string, l ratelimit.Limit) (*ratelimit.Limiter[string], error) {
	if v, ok := s.overrides.Load(ns); ok {
		return v.(*ratelimit.Limiter[string]), nil
	}
	opts := []ratelimit.Option{ratelimit.WithNamespace(ns)}
	if s.clock != nil {
		opts = append(opts, ratelimit.WithClock(s.clock))
	}
	lim, err := ratelimit.New[string](s.store, l, opts...)
	if err != nil || s.nOverrides.Load() >= maxOverrides {
		return lim, err
	}
	if v, loaded := s.overrides.LoadOrStore(ns, lim); loaded {
		return v.(*ratelimit.Limiter[string]), nil
	}
	s.nOverrides.Add(1)
	return lim, nil
}
