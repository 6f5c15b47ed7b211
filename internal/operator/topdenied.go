package operator

import (
	"slices"
	"strings"
)

// spaceSaving is the Space-Saving heavy-hitters sketch (Metwally, Agrawal
// and El Abbadi, 2005) over a fixed number of counters, with the counts
// halved every half-life so that it ranks the last minutes. Any subject
// denied more than a 1/len(counters) share of the (decayed) denials is in
// it; a count overestimates by at most its err. The caller locks.
type spaceSaving struct {
	counters []counter
	epoch    int64 // half-lives since the Unix epoch, at the last decay
}

type counter struct {
	namespace, subject string
	count, err         uint64
}

func newSpaceSaving(n int) *spaceSaving { return &spaceSaving{counters: make([]counter, 0, n)} }

// add counts one denial of subject in namespace ns at half-life epoch.
func (s *spaceSaving) add(ns, subject string, epoch int64) {
	s.decay(epoch)
	lowest := -1
	for i := range s.counters {
		c := &s.counters[i]
		if c.subject == subject && c.namespace == ns {
			c.count++
			return
		}
		if lowest < 0 || c.count < s.counters[lowest].count {
			lowest = i
		}
	}
	if len(s.counters) < cap(s.counters) {
		s.counters = append(s.counters, counter{namespace: ns, subject: subject, count: 1})
		return
	}
	c := &s.counters[lowest]
	*c = counter{namespace: ns, subject: subject, count: c.count + 1, err: c.count}
}

// decay halves the counts once per half-life passed since the last decay,
// and frees the counters that fall to zero.
func (s *spaceSaving) decay(epoch int64) {
	if epoch <= s.epoch {
		return
	}
	shift := min(epoch-s.epoch, 63)
	s.epoch = epoch
	s.counters = slices.DeleteFunc(s.counters, func(c counter) bool {
		c.count >>= shift
		return c.count == 0
	})
	for i := range s.counters {
		s.counters[i].count >>= shift
		s.counters[i].err >>= shift
	}
}

// top returns the n highest counters at epoch, highest first.
func (s *spaceSaving) top(n int, epoch int64) []counter {
	s.decay(epoch)
	out := slices.Clone(s.counters)
	slices.SortFunc(out, func(a, b counter) int {
		if a.count != b.count {
			if a.count > b.count {
				return -1
			}
			return 1
		}
		return strings.Compare(a.namespace+"\x00"+a.subject, b.namespace+"\x00"+b.subject)
	})
	return out[:min(n, len(out))]
}
