package fallback

import (
	"context"
	"errors"
	"fmt"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
)

var _ ratelimit.Assigner = (*Store)(nil)

// Assign sets subject's assignment on the primary (see ratelimit.Assigner).
// Assignments live on the primary alone: while it is down (on Cluster, the
// partition of the namespace's assignments), whatever the outage behaviour,
// nothing changes and the error wraps ratelimit.ErrUnavailable. A primary
// that keeps no assignments gives an error wrapping errors.ErrUnsupported.
func (s *Store) Assign(ctx context.Context, namespace, subject, value string) (string, error) {
	var old string
	err := s.assignments(ctx, namespace, func(ctx context.Context, a ratelimit.Assigner) (err error) {
		old, err = a.Assign(ctx, namespace, subject, value)
		return err
	})
	return old, err
}

// Assigned returns subject's assignment from the primary, as Assign reaches
// it.
func (s *Store) Assigned(ctx context.Context, namespace, subject string) (string, error) {
	var v string
	err := s.assignments(ctx, namespace, func(ctx context.Context, a ratelimit.Assigner) (err error) {
		v, err = a.Assigned(ctx, namespace, subject)
		return err
	})
	return v, err
}

// AssignmentsSince returns the changes of namespace's assignments from the
// primary, as Assign reaches it. While the primary is down it answers with
// an error wrapping ratelimit.ErrUnavailable, and a ratelimit.Plans keeps
// the view it last saw.
func (s *Store) AssignmentsSince(ctx context.Context, namespace, cursor string) (changes map[string]string, next string, full bool, err error) {
	err = s.assignments(ctx, namespace, func(ctx context.Context, a ratelimit.Assigner) (err error) {
		changes, next, full, err = a.AssignmentsSince(ctx, namespace, cursor)
		return err
	})
	return changes, next, full, err
}

// assignments calls the primary's Assigner for namespace through the
// breaker of the partition that holds the namespace's assignments.
func (s *Store) assignments(ctx context.Context, namespace string, call func(context.Context, ratelimit.Assigner) error) error {
	a, ok := s.primary.(ratelimit.Assigner)
	if !ok {
		return fmt.Errorf("fallback: the primary keeps no assignments: %w", errors.ErrUnsupported)
	}
	if rule := keyfmt.AssignmentRule(namespace, "-"); rule != "" { // the subject is the primary's to check
		return fmt.Errorf("%w: fallback: %s", ratelimit.ErrInvalidArgument, rule)
	}
	key, _ := keyfmt.Assignments(namespace)
	_, cause, err := s.guard(ctx, key, func(ctx context.Context) (ratelimit.Decision, error) {
		return ratelimit.Decision{}, call(ctx, a)
	})
	if cause != nil {
		return s.unavailable(ctx, key, err)
	}
	return err
}
