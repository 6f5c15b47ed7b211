package tokenbucket

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
)

// naiveWindow is a quota's window by the rules in words, found by looking at
// every candidate start around t: the latest start at or before t, and the
// next one. It shares no code with the calendar package.
func naiveWindow(q ratelimit.Quota, t int64) (start, end int64) {
	loc := q.Start.Location()
	a := q.Start.In(loc)
	lt := time.UnixMicro(t).In(loc)
	clock := func(y int, m time.Month, d int) int64 {
		return time.Date(y, m, d, a.Hour(), a.Minute(), a.Second(), a.Nanosecond(), loc).UnixMicro()
	}
	last := func(y int, m time.Month) int { return time.Date(y, m+1, 0, 12, 0, 0, 0, time.UTC).Day() }
	var starts []int64
	switch q.Period {
	case ratelimit.Day, ratelimit.Week:
		for d := -15; d <= 15; d++ {
			day := time.Date(lt.Year(), lt.Month(), lt.Day()+d, 12, 0, 0, 0, time.UTC)
			if q.Period == ratelimit.Week && day.Weekday() != a.Weekday() {
				continue
			}
			starts = append(starts, clock(day.Year(), day.Month(), day.Day()))
		}
	case ratelimit.Month:
		for m := -3; m <= 3; m++ {
			first := time.Date(lt.Year(), lt.Month()+time.Month(m), 1, 12, 0, 0, 0, time.UTC)
			starts = append(starts, clock(first.Year(), first.Month(), min(a.Day(), last(first.Year(), first.Month()))))
		}
	case ratelimit.Year:
		for y := lt.Year() - 2; y <= lt.Year()+2; y++ {
			starts = append(starts, clock(y, a.Month(), min(a.Day(), last(y, a.Month()))))
		}
	}
	slices.Sort(starts)
	for i, s := range starts {
		if s <= t && t < starts[i+1] {
			return s, starts[i+1]
		}
	}
	panic("no window")
}

// quotaModel is what a bucket's quotas used, by the rules in words: the
// windows of the policy that last took tokens, and what each used.
type quotaModel struct {
	quotas []ratelimit.Quota
	win    [][2]int64
	used   []int64
}

// at returns what quota q of quotas used in its window at t: the count of
// the first stored window equal to it that no earlier quota took.
func (m *quotaModel) at(quotas []ratelimit.Quota, t int64) (used []int64, wins [][2]int64) {
	taken := make([]bool, len(m.win))
	for _, q := range quotas {
		s, e := naiveWindow(q, t)
		u := int64(0)
		for k, w := range m.win {
			if !taken[k] && w == [2]int64{s, e} {
				taken[k], u = true, m.used[k]
				break
			}
		}
		used, wins = append(used, u), append(wins, [2]int64{s, e})
	}
	return used, wins
}

// quotaModelSequences is how many random sequences TestQuotaModel runs.
var quotaModelSequences = 400

// TestQuotaModel runs random checks, reserves, settles and policy changes of
// a limit and calendar quotas through Step and Settle, with a clock that
// crosses window edges (days of 23 and 25 hours in New York and Paris,
// February 29 2028, a month anchored on the 31st), beside a model written
// from the rules alone, and holds every decision to it: allowed exactly when
// the bucket holds the cost and every quota has it left; what each quota's
// window used; each quota's standing; a denial by a quota waits for its
// window's end.
func TestQuotaModel(t *testing.T) {
	paris, _ := time.LoadLocation("Europe/Paris")
	newYork, _ := time.LoadLocation("America/New_York")
	lim := ratelimit.NewLimit(1000, time.Second, 1000)
	policies := [][]ratelimit.Quota{
		{ratelimit.CalendarQuota(20, ratelimit.Day, newYork)},
		{ratelimit.CalendarQuota(30, ratelimit.Day, newYork)}, // raised: the day keeps what it used
		{ratelimit.CalendarQuota(5, ratelimit.Day, newYork)},  // lowered below it: denied to the day's end
		{ratelimit.CalendarQuota(25, ratelimit.Day, paris), ratelimit.CalendarQuota(60, ratelimit.Week, paris)},
		{{Allowance: 40, Period: ratelimit.Month, Start: time.Date(2027, 1, 31, 23, 30, 0, 0, paris)}},
		{{Allowance: 50, Period: ratelimit.Year, Start: time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC)}, ratelimit.CalendarQuota(45, ratelimit.Month, nil)},
	}
	// Starts just before a daylight-saving change or a leap day, so that the
	// clock's steps cross it.
	starts := []time.Time{
		time.Date(2027, 3, 13, 20, 0, 0, 0, newYork), time.Date(2027, 11, 6, 20, 0, 0, 0, newYork),
		time.Date(2027, 3, 27, 20, 0, 0, 0, paris), time.Date(2027, 10, 30, 20, 0, 0, 0, paris),
		time.Date(2028, 2, 27, 12, 0, 0, 0, time.UTC), time.Date(2027, 2, 27, 12, 0, 0, 0, paris),
	}
	rng := rand.New(rand.NewPCG(13, 17))
	for seq := range quotaModelSequences {
		var st State
		var m quotaModel
		now := starts[seq%len(starts)].UnixMicro()
		quotas := policies[rng.IntN(len(policies))]
		type res struct {
			holds []Hold
			costs []int64
			wins  [][2]int64
		}
		var open []res
		// The limit, 1,000 a second against quotas of tens, never binds.
		for step := range 120 {
			switch x := rng.IntN(10); {
			case x < 3:
				now += rng.Int64N(4 * 3600 * 1_000_000)
			case x < 5 && len(quotas) > 0:
				_, end := naiveWindow(quotas[rng.IntN(len(quotas))], now)
				now = end + rng.Int64N(2_000_000) - 1_000_000
			case x < 6:
				quotas = policies[rng.IntN(len(policies))]
			default:
				now += rng.Int64N(60_000_000)
			}
			what := fmt.Sprintf("seq %d step %d at %v", seq, step, time.UnixMicro(now).UTC())
			used, wins := m.at(quotas, now)
			costs := []int64{1}
			for range quotas {
				costs = append(costs, 1+rng.Int64N(4))
			}
			fits := true
			for j, q := range quotas {
				fits = fits && costs[1+j] <= q.Allowance-used[j]
			}
			r := ratelimit.Request{Limits: []ratelimit.Limit{lim}, Quotas: quotas, Costs: costs}
			switch x := rng.IntN(10); {
			case x < 2 && len(open) > 0: // settle any one
				i := rng.IntN(len(open))
				rv := open[i]
				open = slices.Delete(open, i, i+1)
				// The limit uses what it reserved, so that the bucket
				// changes only through the quotas.
				actual := []int64{rv.costs[0]}
				for j := range quotas {
					a := rng.Int64N(10)
					if j < len(rv.costs)-1 && rng.IntN(2) == 0 {
						a = rv.costs[1+j]
					}
					actual = append(actual, a)
				}
				d, _, write := st.Settle(ratelimit.Request{Limits: r.Limits, Quotas: quotas}, rv.holds, actual, now)
				// Each quota whose window is the reserved one, by the
				// hold that matched it in order, gets its difference.
				taken := make([]bool, len(rv.wins))
				changed := false
				for j := range quotas {
					for k, w := range rv.wins {
						if !taken[k] && w == wins[j] {
							taken[k] = true
							u := min(max(0, used[j]+actual[1+j]-rv.costs[1+k]), MaxExact)
							changed = changed || u != used[j]
							used[j] = u
							break
						}
					}
				}
				if write != changed {
					t.Fatalf("%s: settle %v of %v wrote %v, the model changed %v", what, actual, rv.costs, write, changed)
				}
				m.check(t, what+" settle", d, quotas, used, wins, now, 1)
				if changed {
					m.quotas, m.win, m.used = quotas, wins, used
				}
			default:
				reserve := x < 5
				d, _, write := st.Step(r, now)
				if d.Allowed != fits || write != fits {
					t.Fatalf("%s: check %v of %v = %+v, model: used %v, fits %v", what, costs, quotas, d, used, fits)
				}
				if fits {
					for j := range quotas {
						used[j] += costs[1+j]
					}
				}
				m.check(t, what, d, quotas, used, wins, now, 0)
				if fits {
					m.quotas, m.win, m.used = quotas, wins, used
					if reserve {
						open = append(open, res{Held(r, st.Last), costs, wins})
					}
				}
			}
		}
	}
}

// check holds d's standings to the model's counts.
func (m *quotaModel) check(t *testing.T, what string, d ratelimit.Decision, quotas []ratelimit.Quota, used []int64, wins [][2]int64, now int64, need int64) {
	t.Helper()
	if len(d.Standings) != 1+len(quotas) {
		t.Fatalf("%s: %d standings for 1 limit and %d quotas", what, len(d.Standings), len(quotas))
	}
	for j, q := range quotas {
		s := d.Standings[1+j]
		if want := max(0, q.Allowance-used[j]); s.Remaining != want {
			t.Fatalf("%s: quota %d (%v) remaining %d, model %d (used %d)", what, j, q, s.Remaining, want, used[j])
		}
		if want := time.Duration(wins[j][1]-now) * time.Microsecond; s.ResetAfter != want {
			t.Fatalf("%s: quota %d reset after %v, model %v", what, j, s.ResetAfter, want)
		}
		if !d.Allowed && d.Binding == 1+j && d.RetryAfter != time.Duration(wins[j][1]-now)*time.Microsecond {
			t.Fatalf("%s: denied by quota %d, retry after %v, window ends in %v", what, j, d.RetryAfter, time.Duration(wins[j][1]-now)*time.Microsecond)
		}
		if !d.Allowed && need > 0 && used[j]+need > q.Allowance && d.RetryAfter < time.Duration(wins[j][1]-now)*time.Microsecond {
			t.Fatalf("%s: quota %d has no token left, retry after %v before its window ends", what, j, d.RetryAfter)
		}
	}
}
