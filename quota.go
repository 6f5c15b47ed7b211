package ratelimit

import (
	"fmt"
	"strconv"
	"time"

	"github.com/exactlimit/ratelimit/internal/arith"
	"github.com/exactlimit/ratelimit/internal/calendar"
)

// Period is the calendar unit of a Quota's window.
type Period uint8

// The periods of a Quota.
const (
	Day   Period = calendar.Day
	Week  Period = calendar.Week
	Month Period = calendar.Month
	Year  Period = calendar.Year
)

// String returns "day", "week", "month" or "year".
func (p Period) String() string {
	switch p {
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return "Period(" + strconv.Itoa(int(p)) + ")"
}

// Quota is an allowance of tokens per calendar window: "100,000 a month".
// Unlike a bucket it does not refill smoothly: what a window's checks take
// is counted against Allowance until the window ends, and the next window
// starts with nothing used.
//
// A policy holds quotas beside its bucket limits (see WithQuotas), and one
// check decides them all: it is admitted only when every bucket holds the
// cost and every quota's window has the cost left, and then takes it from
// all of them. Windows follow the clock the buckets follow (the Redis
// server's TIME, or the Limiter's WithClock).
//
// Quota is comparable; two Quotas are the same policy when they are ==.
type Quota struct {
	// Allowance is the number of tokens a window allows, at least 1.
	Allowance int64
	// Period is the window's length: a Day, a Week, a Month or a Year.
	Period Period
	// Start anchors the windows, in its own location (time zone): a day
	// starts at Start's clock time; a week on Start's weekday at that time;
	// a month on Start's day of the month (on the month's last day when it
	// has fewer days) at that time; a year on Start's month and day. Only
	// those fields of Start count, not its year. The zero Start is
	// midnight UTC: days from midnight, weeks from Monday, months from the
	// 1st and years from January 1st, all in UTC. For calendar months in
	// Paris, Start is midnight of any 1st in Paris, as CalendarQuota gives.
	Start time.Time
}

// CalendarQuota returns a Quota of allowance tokens per calendar period in
// loc: days from midnight, weeks from Monday, months from the 1st, years
// from January 1st, each at midnight in loc. A nil loc is UTC.
func CalendarQuota(allowance int64, period Period, loc *time.Location) Quota {
	if loc == nil {
		loc = time.UTC
	}
	// January 1st, 2001 was a Monday.
	return Quota{Allowance: allowance, Period: period, Start: time.Date(2001, time.January, 1, 0, 0, 0, 0, loc)}
}

// Window returns the window of q that holds t: start <= t < end. Days of 23
// and 25 hours (daylight saving), month lengths and leap years are exact. q
// must be valid.
func (q Quota) Window(t time.Time) (start, end time.Time) {
	s, e := calendar.Window(uint8(q.Period), q.Start, t.UnixMicro())
	return time.UnixMicro(s), time.UnixMicro(e)
}

// String describes the quota: "100000 a month in Europe/Paris", with the
// anchor when it is not the calendar's ("from day 15 09:00").
func (q Quota) String() string {
	s := strconv.FormatInt(q.Allowance, 10) + " a " + q.Period.String()
	a := q.Start
	switch {
	case q.Period == Day && (a.Hour() != 0 || a.Minute() != 0 || a.Second() != 0 || a.Nanosecond() != 0):
		s += " from " + a.Format("15:04:05.999999")
	case q.Period == Week && (a.Weekday() != time.Monday || a.Hour() != 0 || a.Minute() != 0 || a.Second() != 0 || a.Nanosecond() != 0):
		s += " from " + a.Format("Monday 15:04:05.999999")
	case q.Period == Month && (a.Day() != 1 || a.Hour() != 0 || a.Minute() != 0 || a.Second() != 0 || a.Nanosecond() != 0):
		s += " from day " + strconv.Itoa(a.Day()) + " " + a.Format("15:04:05.999999")
	case q.Period == Year && (a.YearDay() != 1 || a.Hour() != 0 || a.Minute() != 0 || a.Second() != 0 || a.Nanosecond() != 0):
		s += " from " + a.Format("January 2 15:04:05.999999")
	}
	return s + " in " + a.Location().String()
}

// Validate reports whether the quota can be enforced exactly. The error
// wraps ErrInvalidArgument and names the rule it broke: the allowance must
// be between 1 and 2^53, the period one of Day, Week, Month and Year, and
// Start a whole number of microseconds.
func (q Quota) Validate() error {
	if rule := q.brokenRule(); rule != "" {
		return invalid("%s", rule)
	}
	return nil
}

func (q Quota) brokenRule() string {
	switch {
	case q.Allowance < 1:
		return fmt.Sprintf("quota allowance must be at least 1 (got %d)", q.Allowance)
	case q.Allowance > arith.MaxExact:
		return fmt.Sprintf("quota allowance must be at most 2^53 (got %d)", q.Allowance)
	case q.Period < Day || q.Period > Year:
		return fmt.Sprintf("quota period must be day, week, month or year (got %d)", q.Period)
	case q.Start.Nanosecond()%1000 != 0:
		return fmt.Sprintf("quota start must be a whole number of microseconds (got %v)", q.Start)
	}
	return ""
}

// Standing is where one limit or quota of a policy stands after a check
// (see Decision.Standings).
type Standing struct {
	// Remaining is the number of whole tokens left: for a quota, its
	// allowance less what its window used, and never below zero.
	Remaining int64
	// ResetAfter is, for a limit, the wait until its bucket is full again;
	// for a quota, the wait until its window ends and the next one starts
	// with nothing used.
	ResetAfter time.Duration
}

// WithQuotas adds quotas to the limiter's policy, beside its limits: a check
// is admitted only when every limit's bucket holds the cost and every
// quota's current window has the cost left, and a denial takes nothing from
// any of them. The bucket is still one key, one atomic step per check.
// A policy combines at most 8 limits and quotas in all; each quota must be
// valid (see Quota.Validate), and a cost above a quota's allowance is
// refused as invalid, before any store call.
func WithQuotas(quotas ...Quota) Option {
	return func(o *options) { o.quotas = append(o.quotas, quotas...) }
}
