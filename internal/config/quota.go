package config

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/exactlimit/ratelimit"
)

// Quota is a namespace's quota: what it allows, and whether it counts
// tokens (counts: tokens) rather than requests.
type Quota struct {
	ratelimit.Quota
	Tokens bool
}

// LimiterQuotas returns p's quotas as a Limiter takes them
// (ratelimit.WithQuotas), in order.
func (p Policy) LimiterQuotas() []ratelimit.Quota {
	if len(p.Quotas) == 0 {
		return nil
	}
	q := make([]ratelimit.Quota, len(p.Quotas))
	for i, c := range p.Quotas {
		q[i] = c.Quota
	}
	return q
}

type quota struct {
	Period    string `yaml:"period"`
	Allowance int64  `yaml:"allowance"`
	TimeZone  string `yaml:"time_zone"`
	Start     string `yaml:"start"`
	Counts    string `yaml:"counts"`
}

// zones holds each time zone loaded, by name, so that a config loaded again
// gives its quotas the same *time.Location, and so quotas equal to the
// ones it replaces (a Quota is compared with ==).
var zones sync.Map

// zone returns the time zone name, loaded once.
func zone(name string) (*time.Location, error) {
	if loc, ok := zones.Load(name); ok {
		return loc.(*time.Location), nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, err
	}
	actual, _ := zones.LoadOrStore(name, loc)
	return actual.(*time.Location), nil
}

// periods are the names of a quota's periods.
var periods = map[string]ratelimit.Period{"day": ratelimit.Day, "week": ratelimit.Week, "month": ratelimit.Month, "year": ratelimit.Year}

// quota is the quota q describes, in a namespace with a token_limit when
// tokens. The error starts with the field it is about.
func (q quota) quota(tokens bool) (Quota, error) {
	period, ok := periods[q.Period]
	if !ok {
		return Quota{}, fmt.Errorf("period %q: want day, week, month or year", q.Period)
	}
	if q.Allowance < 1 {
		return Quota{}, fmt.Errorf("allowance must be at least 1 (got %d)", q.Allowance)
	}
	loc := time.UTC
	if q.TimeZone != "" {
		var err error
		if loc, err = zone(q.TimeZone); err != nil || q.TimeZone == "Local" {
			return Quota{}, fmt.Errorf("time_zone %q: not an IANA time zone (Europe/Paris, America/New_York, UTC)", q.TimeZone)
		}
	}
	c := Quota{Quota: ratelimit.CalendarQuota(q.Allowance, period, loc)}
	if q.Start != "" {
		start, err := time.ParseInLocation("2006-01-02T15:04", q.Start, loc)
		if err != nil {
			if start, err = time.ParseInLocation("2006-01-02T15:04:05", q.Start, loc); err != nil {
				return Quota{}, fmt.Errorf("start %q: want a local date and time, 2006-01-02T15:04 or 2006-01-02T15:04:05", q.Start)
			}
		}
		c.Start = start
	}
	switch q.Counts {
	case "", "requests":
	case "tokens":
		if !tokens {
			return Quota{}, errors.New("counts: tokens needs the namespace's token_limit")
		}
		c.Tokens = true
	default:
		return Quota{}, fmt.Errorf("counts %q: want requests or tokens", q.Counts)
	}
	if err := c.Validate(); err != nil {
		return Quota{}, fmt.Errorf("allowance: %s", strings.TrimPrefix(err.Error(), ratelimit.ErrInvalidArgument.Error()+": "))
	}
	return c, nil
}
