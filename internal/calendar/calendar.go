// Package calendar finds the calendar windows of quotas: a day, a week, a
// month or a year in a time zone, from an anchor. It is the one place the tz
// database is read: the root package's Quota.Window, tokenbucket's step and
// the Redis script's arguments all take their windows from Window.
package calendar

import (
	"sync/atomic"
	"time"
	"unsafe"
)

// The periods of a window, as the root package numbers them.
const (
	Day   = 1
	Week  = 2
	Month = 3
	Year  = 4
)

// Window returns the window of period that holds t, in µs since the Unix
// epoch: start <= t < end. Windows are anchored at anchor, read in its own
// location: a day starts at the anchor's clock time; a week on the anchor's
// weekday at that time; a month on the anchor's day of the month (or the
// month's last day, when it has fewer) at that time; a year on the anchor's
// month and day (February 28 for a February 29 anchor in a common year).
// A clock time that the zone skips on a given day (a daylight-saving gap)
// is the time.Date normalisation of it, an hour later. period must be one
// of Day, Week, Month and Year.
//
// Results are memoized, so a window asked for again costs a few
// nanoseconds; it is safe for simultaneous use.
func Window(period uint8, anchor time.Time, t int64) (start, end int64) {
	loc := anchor.Location()
	au := anchor.UnixMicro()
	slot := &memo[(uint64(au)*0x9e3779b97f4a7c15^uint64(period)^uint64(uintptr(unsafe.Pointer(loc))))>>56]
	if w := slot.Load(); w != nil && w.period == period && w.anchor == au && w.loc == loc && w.start <= t && t < w.end {
		return w.start, w.end
	}
	start, end = compute(period, anchor, loc, t)
	slot.Store(&window{period: period, anchor: au, loc: loc, start: start, end: end})
	return start, end
}

// Around returns the window that holds t and its two neighbours: the
// previous window's start, and the next window's end. A caller that knows
// t only roughly (a Redis server's clock, near this host's) passes all
// three, and the server picks the one that holds its own time.
func Around(period uint8, anchor time.Time, t int64) (prevStart, start, end, nextEnd int64) {
	start, end = Window(period, anchor, t)
	prevStart, _ = Window(period, anchor, start-1)
	_, nextEnd = Window(period, anchor, end)
	return prevStart, start, end, nextEnd
}

// window is one memoized result of Window.
type window struct {
	period     uint8
	anchor     int64
	loc        *time.Location
	start, end int64
}

// memo holds the latest window of up to 256 quotas, by a hash of the
// quota; two quotas of one slot take turns.
var memo [256]atomic.Pointer[window]

func compute(period uint8, anchor time.Time, loc *time.Location, t int64) (start, end int64) {
	anchor = anchor.In(loc)
	h, m, s := anchor.Clock()
	ns := anchor.Nanosecond()
	at := func(y int, mo time.Month, d int) int64 {
		return time.Date(y, mo, d, h, m, s, ns, loc).UnixMicro()
	}
	lt := time.UnixMicro(t).In(loc)
	y, mo, d := lt.Date()
	switch period {
	case Day:
		if start = at(y, mo, d); start > t {
			d--
			start = at(y, mo, d)
		}
		return start, at(y, mo, d+1)
	case Week:
		d -= (int(lt.Weekday()) - int(anchor.Weekday()) + 7) % 7
		if start = at(y, mo, d); start > t {
			d -= 7
			start = at(y, mo, d)
		}
		return start, at(y, mo, d+7)
	case Month:
		ad := anchor.Day()
		in := func(y int, mo time.Month) int64 { return at(y, mo, min(ad, daysIn(y, mo))) }
		if start = in(y, mo); start > t {
			y, mo = prevMonth(y, mo)
			start = in(y, mo)
		}
		y, mo = nextMonth(y, mo)
		return start, in(y, mo)
	default: // Year
		am, ad := anchor.Month(), anchor.Day()
		in := func(y int) int64 { return at(y, am, min(ad, daysIn(y, am))) }
		if start = in(y); start > t {
			y--
			start = in(y)
		}
		return start, in(y + 1)
	}
}

// daysIn returns the number of days of month mo of year y.
func daysIn(y int, mo time.Month) int {
	return time.Date(y, mo+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

func prevMonth(y int, mo time.Month) (int, time.Month) {
	if mo == time.January {
		return y - 1, time.December
	}
	return y, mo - 1
}

func nextMonth(y int, mo time.Month) (int, time.Month) {
	if mo == time.December {
		return y + 1, time.January
	}
	return y, mo + 1
}
