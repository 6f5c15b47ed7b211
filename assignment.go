package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// An Assignment is stored as a string (see Assigner):
//
//	""                    none
//	"p:" name             the plan of that name
//	"c:" JSON             a policy of the subject's own:
//	                      {"l":[[capacity,refill tokens,refill period in µs],...],
//	                       "q":[{"a":allowance,"p":"month","s":"2001-01-01T00:00:00+01:00","z":"Europe/Paris"},...]}
//
// A quota's anchor (s) is its local date-time with its offset, to the
// microsecond, and z the IANA name of its time zone, so that another process
// rebuilds an equal Quota (one *time.Location per name: see zone). The JSON is
// canonical: a value whose decoding does not encode back to itself is
// refused.

// encodedPlan and encodedPolicy are the prefixes of a stored Assignment.
const (
	encodedPlan   = "p:"
	encodedPolicy = "c:"
)

// policyJSON is a policy of a subject's own as the store holds it.
type policyJSON struct {
	L [][3]int64  `json:"l"`
	Q []quotaJSON `json:"q,omitempty"`
}

type quotaJSON struct {
	A int64  `json:"a"`
	P string `json:"p"`
	S string `json:"s"`
	Z string `json:"z"`
}

// anchorLayout is a quota anchor's layout: RFC 3339 to the microsecond.
const anchorLayout = "2006-01-02T15:04:05.999999Z07:00"

// encode returns a as the store holds it, after checking it: a plan p
// offers, or a valid policy whose quotas any process can rebuild. The error
// wraps ErrInvalidArgument.
func (p *Plans[K]) encode(a Assignment) (string, error) {
	if a.Plan != "" {
		if len(a.Limits) > 0 || len(a.Quotas) > 0 {
			return "", invalid("an assignment names a plan (%q) or gives a policy of its own, not both", a.Plan)
		}
		if p.byName[a.Plan] == nil {
			return "", invalid("unknown plan %q: the plans on offer are %s", a.Plan, strings.Join(p.names, ", "))
		}
	}
	return encodeAssignment(a)
}

// encodeAssignment returns a as the store holds it. The error wraps
// ErrInvalidArgument.
func encodeAssignment(a Assignment) (string, error) {
	if a.isZero() {
		return "", nil
	}
	if a.Plan != "" {
		if rule := planNameRule(a.Plan); rule != "" {
			return "", invalid("%s", rule)
		}
		return encodedPlan + a.Plan, nil
	}
	if err := validatePolicy(a.Limits, a.Quotas); err != nil {
		return "", err
	}
	var pj policyJSON
	for _, l := range a.Limits {
		pj.L = append(pj.L, [3]int64{l.Capacity, l.RefillTokens, l.periodMicros()})
	}
	for i, q := range a.Quotas {
		name := q.Start.Location().String()
		loc, err := zone(name)
		if err != nil {
			return "", invalid("quota %d: its time zone %q is not one another process can load by name (time.LoadLocation): %v", i, name, err)
		}
		if !q.Start.In(loc).Equal(q.Start) || q.Start.In(loc).Format(anchorLayout) != q.Start.Format(anchorLayout) {
			return "", invalid("quota %d: its time zone %q is not the zone of that name", i, name)
		}
		pj.Q = append(pj.Q, quotaJSON{A: q.Allowance, P: q.Period.String(), S: q.Start.Format(anchorLayout), Z: name})
	}
	b, err := json.Marshal(pj)
	if err != nil {
		return "", invalid("%v", err)
	}
	return encodedPolicy + string(b), nil
}

// errMalformedAssignment is wrapped by the error of a stored value that is
// not an Assignment.
var errMalformedAssignment = errors.New("ratelimit: malformed assignment")

// decodeAssignment returns the Assignment the store holds as v: the zero
// Assignment for "". A value that encodeAssignment does not give is an
// error wrapping errMalformedAssignment; it never panics.
func decodeAssignment(v string) (Assignment, error) {
	switch {
	case v == "":
		return Assignment{}, nil
	case strings.HasPrefix(v, encodedPlan):
		name := v[len(encodedPlan):]
		if rule := planNameRule(name); rule != "" {
			return Assignment{}, fmt.Errorf("%w: %s", errMalformedAssignment, rule)
		}
		return Assignment{Plan: name}, nil
	case !strings.HasPrefix(v, encodedPolicy):
		return Assignment{}, fmt.Errorf("%w: neither a plan (%q) nor a policy (%q)", errMalformedAssignment, encodedPlan, encodedPolicy)
	}
	dec := json.NewDecoder(strings.NewReader(v[len(encodedPolicy):]))
	dec.DisallowUnknownFields()
	var pj policyJSON
	if err := dec.Decode(&pj); err != nil {
		return Assignment{}, fmt.Errorf("%w: %v", errMalformedAssignment, err)
	}
	var a Assignment
	for _, l := range pj.L {
		if l[2] < 1 || l[2] > int64(maxDuration/time.Microsecond) {
			return Assignment{}, fmt.Errorf("%w: a refill period of %d µs", errMalformedAssignment, l[2])
		}
		a.Limits = append(a.Limits, Limit{Capacity: l[0], RefillTokens: l[1], RefillPeriod: time.Duration(l[2]) * time.Microsecond})
	}
	for _, q := range pj.Q {
		period, ok := periodNamed(q.P)
		if !ok {
			return Assignment{}, fmt.Errorf("%w: a quota period %q", errMalformedAssignment, q.P)
		}
		loc, err := zone(q.Z)
		if err != nil {
			return Assignment{}, fmt.Errorf("%w: %v", errMalformedAssignment, err)
		}
		start, err := time.Parse(anchorLayout, q.S)
		if err != nil {
			return Assignment{}, fmt.Errorf("%w: a quota anchor: %v", errMalformedAssignment, err)
		}
		a.Quotas = append(a.Quotas, Quota{Allowance: q.A, Period: period, Start: start.In(loc)})
	}
	if err := validatePolicy(a.Limits, a.Quotas); err != nil {
		return Assignment{}, fmt.Errorf("%w: %v", errMalformedAssignment, err)
	}
	if again, err := encodeAssignment(a); err != nil || again != v {
		return Assignment{}, fmt.Errorf("%w: not in its canonical form", errMalformedAssignment)
	}
	return a, nil
}

// maxDuration is the longest time.Duration.
const maxDuration = time.Duration(1<<63 - 1)

// periodNamed returns the Period whose String is name.
func periodNamed(name string) (Period, bool) {
	for p := Day; p <= Year; p++ {
		if p.String() == name {
			return p, true
		}
	}
	return 0, false
}

// zones holds each time zone loaded by name, once: name -> *time.Location.
var zones sync.Map

// zone returns the time zone of the IANA name, the same *time.Location for
// every call with one name, so that Quotas rebuilt from stored assignments
// compare equal (==). "UTC" is time.UTC; "Local" and "" are refused, being
// this machine's zone and not a name.
func zone(name string) (*time.Location, error) {
	switch name {
	case "UTC":
		return time.UTC, nil
	case "", "Local":
		return nil, fmt.Errorf("time zone %q is not an IANA name", name)
	}
	if loc, ok := zones.Load(name); ok {
		return loc.(*time.Location), nil
	}
	if strings.ContainsAny(name, "\x00\\") || strings.Contains(name, "..") {
		return nil, fmt.Errorf("time zone %q is not an IANA name", name)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, err
	}
	got, _ := zones.LoadOrStore(name, loc)
	return got.(*time.Location), nil
}
