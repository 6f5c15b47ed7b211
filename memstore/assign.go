package memstore

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
)

// logLength is the most changes a namespace's log keeps: a caller whose
// cursor is older gets the whole set (see AssignmentsSince).
const logLength = 1024

var _ ratelimit.Assigner = (*Store)(nil)

// assignments holds the subjects' assignments (see ratelimit.Assigner), by
// namespace.
type assignments struct {
	mu sync.Mutex
	ns map[string]*assigned
}

// assigned is one namespace's assignments and the log of their latest
// changes.
type assigned struct {
	values map[string]string
	log    []change // the latest changes, oldest first, at most logLength
	seq    uint64   // the sequence number of the latest change; 0 before any
}

// change is one entry of a namespace's log.
type change struct {
	seq            uint64
	subject, value string
}

// lock checks an assignment's namespace and subject (an empty one is
// refused) and ctx, then locks the assignments and returns the namespace's,
// nil when it has none; unlock with a.mu.Unlock when err is nil.
func (a *assignments) lock(ctx context.Context, namespace, subject string) (*assigned, error) {
	if rule := keyfmt.AssignmentRule(namespace, subject); rule != "" {
		return nil, fmt.Errorf("%w: memstore: %s", ratelimit.ErrInvalidArgument, rule)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a.mu.Lock()
	return a.ns[namespace], nil
}

// Assign sets subject's assignment in namespace to value ("" removes it)
// and logs the change, atomically with respect to every other call on
// assignments; it returns the value replaced. The log keeps a namespace's
// latest 1024 changes. ctx is honoured only in that a cancelled context is
// an error.
func (s *Store) Assign(ctx context.Context, namespace, subject, value string) (string, error) {
	a := &s.assigned
	sp, err := a.lock(ctx, namespace, subject)
	if err != nil {
		return "", err
	}
	defer a.mu.Unlock()
	if sp == nil {
		if value == "" {
			return "", nil
		}
		if a.ns == nil {
			a.ns = make(map[string]*assigned)
		}
		sp = &assigned{values: make(map[string]string)}
		a.ns[namespace] = sp
	}
	old := sp.values[subject]
	if old == value {
		return old, nil
	}
	if value == "" {
		delete(sp.values, subject)
	} else {
		sp.values[subject] = value
	}
	sp.seq++
	if len(sp.log) == logLength {
		sp.log = append(sp.log[:0], sp.log[1:]...)
	}
	sp.log = append(sp.log, change{seq: sp.seq, subject: subject, value: value})
	return old, nil
}

// Assigned returns subject's assignment in namespace, "" when none.
func (s *Store) Assigned(ctx context.Context, namespace, subject string) (string, error) {
	a := &s.assigned
	sp, err := a.lock(ctx, namespace, subject)
	if err != nil {
		return "", err
	}
	defer a.mu.Unlock()
	if sp == nil {
		return "", nil
	}
	return sp.values[subject], nil
}

// AssignmentsSince returns the changes of namespace's assignments after
// cursor, a sequence number in decimal, as ratelimit.Assigner says: the
// whole set when cursor is "", is not a number this store gave, or is
// older than the oldest change the log keeps.
func (s *Store) AssignmentsSince(ctx context.Context, namespace, cursor string) (map[string]string, string, bool, error) {
	a := &s.assigned
	sp, err := a.lock(ctx, namespace, "-") // any subject: none is named
	if err != nil {
		return nil, "", false, err
	}
	defer a.mu.Unlock()
	if sp == nil {
		sp = &assigned{}
	}
	next := strconv.FormatUint(sp.seq, 10)
	after, perr := strconv.ParseUint(cursor, 10, 64)
	oldest := sp.seq // the change before the oldest the log keeps
	if len(sp.log) > 0 {
		oldest = sp.log[0].seq - 1
	}
	if perr != nil || after > sp.seq || after < oldest {
		all := make(map[string]string, len(sp.values))
		for k, v := range sp.values {
			all[k] = v
		}
		return all, next, true, nil
	}
	changes := make(map[string]string)
	for _, c := range sp.log[len(sp.log)-int(sp.seq-after):] {
		changes[c.subject] = c.value
	}
	return changes, next, false, nil
}
