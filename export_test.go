package ratelimit

import "sync/atomic"

// SetWaitJitter replaces the jitter source of l's Wait (a random number in
// [0, n)), so that tests can predict every sleep.
func SetWaitJitter[K any](l *Limiter[K], jitter func(n int64) int64) { l.jitter = jitter }

// WithSleep sets how Wait and WaitN sleep between tries (a test hook).
var WithSleep = withSleep

// LeaseRecords returns the number of subjects l keeps a lease record for.
func LeaseRecords[K any](l *Limiter[K]) int {
	l.leases.mu.RLock()
	defer l.leases.mu.RUnlock()
	return len(l.leases.m)
}

// WaitLeaseReturns waits until l has no give-back of a lease queued or in
// flight.
func WaitLeaseReturns[K any](l *Limiter[K]) {
	ls := l.leases
	ls.rmu.Lock()
	ch := ls.drained
	ls.rmu.Unlock()
	if ch != nil {
		<-ch
	}
}

// LeaseReturnQueue is the most give-backs of leases a limiter leaves waiting.
const LeaseReturnQueue = leaseReturnQueue

// PolicyChecks counts the policies validatePolicy has checked.
var PolicyChecks atomic.Int64

func init() { policyChecked = func() { PolicyChecks.Add(1) } }

// EncodeAssignment and DecodeAssignment are an Assignment's stored form
// and its reading (see assignment.go).
var (
	EncodeAssignment = encodeAssignment
	DecodeAssignment = decodeAssignment
)

// CustomLimiters returns the number of Limiters of subjects' own policies p
// keeps.
func CustomLimiters[K ~string](p *Plans[K]) int {
	p.custom.mu.Lock()
	defer p.custom.mu.Unlock()
	return p.custom.order.Len()
}
