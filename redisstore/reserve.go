package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// Reserve decides r against the bucket at key as Apply does and, when it is
// allowed, records what each limit took as reservation id, kept for ttl: one
// script call, on the server's clock unless r.Now is set. The record is a key
// of its own in the bucket's slot, so the two are one call on Redis Cluster
// too. Limiter.Reserve calls it; see ratelimit.Reservation.
func (s *Store) Reserve(ctx context.Context, key, id string, r ratelimit.Request, ttl time.Duration) (ratelimit.Decision, error) {
	if err := tokenbucket.ValidateReserve(id, r, ttl); err != nil {
		return ratelimit.Decision{}, err
	}
	d, _, err := s.call(ctx, "reserve", []string{key, keyfmt.Record(key, id)}, s.enc.ReserveArgs(r, ttl), r)
	return d, err
}

// Settle settles reservation id on the bucket at key with actual, the tokens
// each of r's limits really used, as tokenbucket's Settle does, in one script
// call that reads and deletes the record: of two settles of one
// reservation, from any processes, one finds it. Without a record (settled
// already, or expired) nothing changes, and the error wraps
// ratelimit.ErrNotReserved beside the bucket's standing.
//
// When key is a namespace's prefix alone, or empty (a settle by token, which
// does not know the bucket: see ratelimit.Reserver), the call's one key is
// the record, found by its id, which names the bucket's slot (a
// ratelimit token), and the script settles the bucket the record names, when
// that is in the namespace: still one atomic call, on Redis Cluster too, the
// bucket being in the record's slot. Without such a record the Decision is
// zero.
func (s *Store) Settle(ctx context.Context, key, id string, r ratelimit.Request, actual []int64) (ratelimit.Decision, error) {
	if err := tokenbucket.ValidateSettle(id, r, actual); err != nil {
		return ratelimit.Decision{}, err
	}
	keys, args := []string{key, keyfmt.Record(key, id)}, s.enc.SettleArgs(r, actual)
	byRecord := keyfmt.IsPrefix(key)
	if byRecord {
		keys, args = keys[1:], s.enc.SettleRecordArgs(r, actual, key)
	}
	res, err := s.eval(ctx, keys, args)
	var d ratelimit.Decision
	found := false
	if err == nil {
		d, found, err = script.ParseSettle(r, res)
	}
	switch {
	case err != nil:
		return ratelimit.Decision{}, wrapErr("settle", key, err)
	case !found && byRecord:
		return ratelimit.Decision{}, fmt.Errorf("%w: redis settle in %s", ratelimit.ErrNotReserved, keyfmt.Label(key))
	case !found:
		return d, fmt.Errorf("%w: redis settle of %s", ratelimit.ErrNotReserved, keyfmt.Label(key))
	}
	return d, nil
}

// Refund gives r's cost (or costs) back to the bucket at key, capped at each
// limit's capacity, in one script call: the settle of a reservation of that
// cost that used nothing, for a protocol that refunds without a reservation
// (Envoy's negative hits). It cannot tell what was taken: the cap is its one
// bound. r is validated as a check is.
func (s *Store) Refund(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if err := tokenbucket.ValidateRefund(r); err != nil {
		return ratelimit.Decision{}, err
	}
	d, _, err := s.call(ctx, "refund", []string{key}, s.enc.AppendRequest(script.CallArgs(r, script.Refund, 1), r), r)
	return d, err
}
