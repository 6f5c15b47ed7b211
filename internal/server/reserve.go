package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
)

// Bounds on a reservation's lifetime (ReserveRequest.TTLMs).
const (
	// DefaultReservationTTL is the lifetime of a reservation that names
	// none: longer than a long completion of a language model.
	DefaultReservationTTL = 5 * time.Minute
	// MaxReservationTTL bounds a lifetime, and with it how long the store
	// keeps the record of a reservation never settled.
	MaxReservationTTL = time.Hour
)

// MaxTokenBytes bounds a reservation token in a settle: a subject of
// MaxSubjectBytes in base64, and the id.
const MaxTokenBytes = 2 * MaxSubjectBytes

// Counts is a count for every limit of a namespace (a JSON number) or one
// per limit, in the order of the namespace's limits, requests then tokens
// (a JSON array): 1 or [1, 500].
type Counts []int64

// errNullCount is the error of a count that is JSON null: encoding/json
// would read it as 0, and a settle of 0 gives the whole reservation back.
var errNullCount = errors.New("null is not a count: send a whole number, or an array of one per limit, such as 500 or [1, 500]")

// UnmarshalJSON reads a number or an array of numbers. A null, as the
// count or in the array, is an error: it is not 0.
func (c *Counts) UnmarshalJSON(b []byte) error {
	if string(bytes.TrimSpace(b)) == "null" {
		return errNullCount
	}
	var one int64
	if err := json.Unmarshal(b, &one); err == nil {
		*c = Counts{one}
		return nil
	}
	var each []*int64
	if err := json.Unmarshal(b, &each); err != nil || len(each) == 0 {
		return errors.New("a count must be a whole number, or an array of one per limit, such as 500 or [1, 500]")
	}
	out := make(Counts, len(each))
	for i, n := range each {
		if n == nil {
			return errNullCount
		}
		out[i] = *n
	}
	*c = out
	return nil
}

// ReserveRequest is the body of POST /v1/reserve; its fields' JSON names
// are those of fields.
type ReserveRequest struct {
	// Namespace names the policy; empty means config.DefaultNamespace.
	Namespace string
	// Subject is whose bucket to reserve from.
	Subject string
	// Cost is the estimate (default 1): one cost for every limit, or one
	// per limit ([1, 500] for a request of 500 tokens), each between 1
	// and its limit's capacity.
	Cost Counts
	// TTLMs is the reservation's lifetime in milliseconds, 1 up to
	// MaxReservationTTL (default DefaultReservationTTL): not settled by
	// then, it is kept as taken.
	TTLMs *int64
	// Plan is as APIRequest's.
	Plan string
}

// fields are the body's fields: "namespace", "subject", "cost", "ttl_ms"
// and "plan".
func (r *ReserveRequest) fields() []field {
	return []field{{"namespace", &r.Namespace}, {"subject", &r.Subject}, {"cost", &r.Cost}, {"ttl_ms", &r.TTLMs}, {"plan", &r.Plan}}
}

// SettleRequest is the body of POST /v1/settle; its fields' JSON names are
// those of fields.
type SettleRequest struct {
	// Namespace is the namespace the reservation was made in.
	Namespace string
	// Token is the reservation, as /v1/reserve returned it.
	Token string
	// Used is what the work used: one count for every limit, or one per
	// limit ([1, 480]); 0 gives the whole reservation back. It is
	// required: missing or null (or a null in the array), the settle is
	// refused and changes nothing.
	Used Counts
}

// fields are the body's fields: "namespace", "token" and "used".
func (r *SettleRequest) fields() []field {
	return []field{{"namespace", &r.Namespace}, {"token", &r.Token}, {"used", &r.Used}}
}

// reserve is POST /v1/reserve: reserve an estimate from a subject's bucket,
// answered as /v1/acquire answers, with the reservation's token when it is
// allowed.
func (s *Service) reserve(w http.ResponseWriter, r *http.Request) {
	const path = "/v1/reserve"
	var req ReserveRequest
	if !s.request(w, r, path, &req.Subject, req.fields()...) {
		return
	}
	t, ok := s.target(w, path, req.Namespace, req.Subject, req.Plan)
	if !ok {
		return
	}
	ns, pol, lim := t.ns, t.pol, t.lim
	if t.plans && t.plan == "" {
		// A settle finds the policy by the plan the token names.
		s.fail(w, path, http.StatusBadRequest, fmt.Sprintf("the subject has a policy of its own in namespace %q, not a plan: the service reserves under plans only", ns))
		return
	}
	ttl := DefaultReservationTTL
	if req.TTLMs != nil {
		if ms := *req.TTLMs; ms < 1 || ms > MaxReservationTTL.Milliseconds() {
			s.fail(w, path, http.StatusBadRequest, fmt.Sprintf("ttl_ms must be between 1 and %d (got %d)", MaxReservationTTL.Milliseconds(), ms))
			return
		}
		ttl = time.Duration(*req.TTLMs) * time.Millisecond
	}
	costs := []int64(req.Cost)
	if costs == nil {
		costs = []int64{1}
	}
	costs = perPart(pol, costs)
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	rv, err := lim.Reserve(ctx, req.Subject, ttl, costs...)
	cancel()
	if err != nil {
		s.logFailure("reserve", lim, req.Subject, err)
	}
	if s.failed(w, r, path, ns, err) {
		return
	}
	d := rv.Decision
	out := NewDecision(ns, req.Subject, 0, d, pol)
	out.Plan = t.plan
	if len(costs) == 1 {
		out.Cost = costs[0]
	} else {
		out.Costs = costs
	}
	if d.Enforced() && rv.Token() != "" {
		// An outage behaviour that admits without a bucket took nothing:
		// there is nothing to settle.
		out.Token, out.TTLMs = planToken(t.plan, rv.Token()), ttl.Milliseconds()
	}
	s.answer(r.Context(), w, path, lim, req.Subject, &out, d, true)
}

// settleUnavailable is the message of a settle's 503. A settle that timed
// out may still run: a hung Redis holds the command it has read, and runs
// it when it resumes. Exactly once would need the client's retry to be told
// apart from a second settle; a 409 on the retry tells the client instead.
const settleUnavailable = "rate limit store unavailable: the settle may have been applied; retry it with the same token, and a 409 then means it was"

// settle is POST /v1/settle: settle a reservation with what the work used,
// answered with the subject's standing afterwards (200, as /v1/peek
// answers). A reservation that is no longer held (settled or cancelled
// already, expired, or of another namespace) is a 409. A 503 (the store did
// not answer in time) may have been applied all the same.
func (s *Service) settle(w http.ResponseWriter, r *http.Request) {
	const path = "/v1/settle"
	var req SettleRequest
	if !s.request(w, r, path, nil, req.fields()...) {
		return
	}
	switch {
	case req.Token == "":
		s.fail(w, path, http.StatusBadRequest, `token is required: the token /v1/reserve returned`)
		return
	case len(req.Token) > MaxTokenBytes:
		s.fail(w, path, http.StatusBadRequest, fmt.Sprintf("token is longer than %d bytes: not a reservation token", MaxTokenBytes))
		return
	case req.Used == nil:
		s.fail(w, path, http.StatusBadRequest, `used is required: what the work used, such as 480, or [1, 480] for a request of 480 tokens; 0 gives the reservation back`)
		return
	}
	ns, set, ok := s.lookup(w, path, req.Namespace)
	if !ok {
		return
	}
	t := target{ns: ns, pol: set.limits[ns], lim: set.limiters[ns]}
	token := req.Token
	if set.plans[ns] != nil {
		plan, rest, ok := strings.Cut(token, planTokenSep)
		if !ok {
			s.fail(w, path, http.StatusBadRequest, fmt.Sprintf("token is not a reservation token of namespace %q, a namespace of plans: send the token /v1/reserve returned", ns))
			return
		}
		if t, ok = s.planTarget(w, path, ns, set, plan); !ok {
			return
		}
		token = rest
	}
	pol, lim := t.pol, t.lim
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	d, err := lim.Settle(ctx, token, perPart(pol, req.Used)...)
	cancel()
	if errors.Is(err, ratelimit.ErrNotReserved) {
		s.fail(w, path, http.StatusConflict, "no such reservation in namespace "+fmt.Sprintf("%q", ns)+": it was settled or cancelled already, or it expired")
		return
	}
	if err != nil {
		s.logFailure("settle", lim, "", err)
	}
	if s.failedSaying(w, r, path, ns, err, settleUnavailable) {
		return
	}
	out := NewDecision(ns, "", 0, d, pol)
	out.Plan = t.plan
	s.answer(r.Context(), w, path, lim, "", &out, d, false)
}

// planTokenSep parts the plan from the library's token in the token of a
// reservation in a namespace of plans: neither a plan's name nor a
// library token holds it.
const planTokenSep = ":"

// planToken returns the token of a reservation made under plan: token
// itself outside a namespace of plans (plan ""), else "<plan>:<token>", so
// that the settle, which knows no subject, settles under the policy the
// reservation was made under. (Under another plan's the settle would carry
// the subject's bucket over to that plan, as any check under another
// policy does.)
func planToken(plan, token string) string {
	if plan == "" || token == "" {
		return token
	}
	return plan + planTokenSep + token
}

// perPart returns counts, a reserve's costs or a settle's used counts, one
// per limit and quota of pol: counts as they are when they are one count or
// one per limit and quota; for a namespace with quotas given one count per
// limit (requests and tokens), each quota takes the count of what it counts.
func perPart(pol config.Policy, counts []int64) []int64 {
	if len(pol.Quotas) == 0 || len(counts) != len(pol.Limits()) || len(counts) == 1 {
		return counts
	}
	return pol.Costs(counts[0], counts[len(counts)-1])
}

// logFailure logs an operation's error that is not the request's own, at
// most a line a second, naming subject ("" when unknown) by its hash.
func (s *Service) logFailure(op string, lim *ratelimit.Limiter[string], subject string, err error) {
	if errors.Is(err, ratelimit.ErrInvalidArgument) || errors.Is(err, context.Canceled) {
		return
	}
	ns := lim.Namespace()
	args := []any{"op", op, "namespace", ns}
	key := ""
	if subject != "" {
		args = append(args, "subject", keyfmt.Hash(subject))
		key = lim.Key(subject)
	}
	s.errLog.log(s.log, "check failed", append(args, "err", redactErr(err, key, ns, subject))...)
}

// openAIHeaders sets OpenAI's rate-limit headers for subject under lim,
// a namespace of requests and tokens (see httplimit.SetOpenAIHeaders),
// bounded by the service's timeout. When the store does not answer, the
// answer goes without them.
func (s *Service) openAIHeaders(ctx context.Context, h http.Header, lim *ratelimit.Limiter[string], subject string) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := httplimit.SetOpenAIHeaders(ctx, h, lim, subject); err != nil {
		s.logFailure("peek", lim, subject, err)
	}
}
