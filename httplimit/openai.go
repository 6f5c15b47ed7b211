package httplimit

import (
	"context"
	"fmt"
	"net/http"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/ratelimitheader"
)

// SetOpenAIHeaders sets on h the rate-limit headers OpenAI's API sends, for
// subject under lim, a limiter of two limits, requests then tokens (as
// ratelimit.NewMulti builds it from a requests-per-minute and a
// tokens-per-minute limit):
//
//   - x-ratelimit-limit-requests and x-ratelimit-limit-tokens: each limit's
//     capacity;
//   - x-ratelimit-remaining-requests and x-ratelimit-remaining-tokens: the
//     whole tokens each holds (0 while it is in debt);
//   - x-ratelimit-reset-requests and x-ratelimit-reset-tokens: the time until
//     each limit's bucket is full, rounded up to the millisecond and written
//     as OpenAI writes it, in Go's duration format ("12ms", "1s", "6m0s").
//
// A Decision names only the limit that bound it, so SetOpenAIHeaders reads
// each limit's standing with a peek of that limit alone: two store calls,
// which take nothing and change nothing. It sets nothing when the store did
// not decide against a bucket (an outage behaviour that admits or denies
// without one). The error is the store's, or wraps
// ratelimit.ErrInvalidArgument when lim does not have two limits.
func SetOpenAIHeaders[K any](ctx context.Context, h http.Header, lim *ratelimit.Limiter[K], subject K) error {
	limits := lim.Limits()
	if len(limits) != 2 {
		return fmt.Errorf("%w: OpenAI's headers want a limiter of two limits, requests and tokens (got %d)", ratelimit.ErrInvalidArgument, len(limits))
	}
	key, r, err := lim.Request(subject, 1)
	if err != nil {
		return err
	}
	var ds [2]ratelimit.Decision
	for i, l := range limits {
		peek := ratelimit.Request{Limits: []ratelimit.Limit{l}, Peek: true, Now: r.Now}
		if ds[i], err = lim.Store().Apply(ctx, key, peek); err != nil {
			return err
		}
		if !ds[i].Enforced() {
			return nil
		}
	}
	var st [2]ratelimitheader.Standing
	for i, d := range ds {
		st[i] = ratelimitheader.Standing{Limit: limits[i].Capacity, Remaining: d.Remaining, ResetAfter: d.ResetAfter}
		if d.Limit.Validate() == nil {
			st[i].Limit = d.Limit.Capacity // a fallback's share, say
		}
	}
	ratelimitheader.SetOpenAI(h, st[0], st[1])
	return nil
}
