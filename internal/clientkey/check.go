package clientkey

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/exactlimit/ratelimit"
)

// Options collects the first invalid option of a middleware's constructor.
type Options struct {
	pkg string
	err error
}

// NewOptions returns an Options whose errors are prefixed by pkg.
func NewOptions(pkg string) Options { return Options{pkg: pkg} }

// Fail records an invalid option, unless one was recorded already.
func (o *Options) Fail(format string, args ...any) {
	if o.err == nil {
		o.err = o.Invalid(format, args...)
	}
}

// NotNil records an invalid option when ok is false: name must not be nil.
func (o *Options) NotNil(ok bool, name string) {
	if !ok {
		o.Fail("%s must not be nil", name)
	}
}

// Err returns the first invalid option recorded, nil when none was.
func (o *Options) Err() error { return o.err }

// Invalid returns an error wrapping ratelimit.ErrInvalidArgument, prefixed
// by the package name.
func (o *Options) Invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s: "+format, append([]any{ratelimit.ErrInvalidArgument, o.pkg}, args...)...)
}

// Timeout records a negative timeout as invalid and returns d.
func (o *Options) Timeout(d time.Duration) time.Duration {
	if d < 0 {
		o.Fail("timeout must not be negative (got %v)", d)
	}
	return d
}

// PolicyName records a policy name that cannot be sent in a header or in
// metadata: it must be 1 to 64 printable ASCII characters, so that it fits
// a structured-field string without escaping surprises.
func (o *Options) PolicyName(s string) {
	ok := s != "" && len(s) <= 64
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] >= 0x20 && s[i] <= 0x7e
	}
	if !ok {
		o.Fail("policy name %q must be 1 to 64 printable ASCII characters", s)
	}
}

// WithTimeout returns ctx bounded by d, or ctx itself when d is 0: a check
// is then bounded by the caller's deadline only.
func WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// Failure says what a Limiter's error means for the request it was asked
// about.
type Failure int

const (
	// Outage: the store could not decide; the request gets 503 /
	// Unavailable, or the error handler's answer.
	Outage Failure = iota
	// Invalid: the request's own arguments were refused (its cost); it
	// gets 400 / InvalidArgument with the message of Classify.
	Invalid
	// Gone: the client went away or its deadline passed; nobody to answer.
	Gone
)

// Classify tells what err, a Limiter's error for a request whose context
// is ctx, means; for Invalid, msg is the error's message without the
// ErrInvalidArgument prefix.
func Classify(ctx context.Context, err error) (f Failure, msg string) {
	switch {
	case errors.Is(err, ratelimit.ErrInvalidArgument):
		return Invalid, strings.TrimPrefix(err.Error(), ratelimit.ErrInvalidArgument.Error()+": ")
	case ctx.Err() != nil:
		return Gone, ""
	}
	return Outage, ""
}

// Key returns what a key function gave, key and err, checked: an empty key
// is an error wrapping ErrNoKey, and a key longer than MaxBytes one
// wrapping ErrKeyTooLong.
func Key(key string, err error) (string, error) {
	switch {
	case err != nil:
		return "", err
	case key == "":
		return "", ErrNoKey
	}
	return key, CheckLen("the key", key)
}

// Require records an invalid option for the first of the functions a
// middleware cannot do without that is not set: names lists them, separated
// by ", ", and set says of each whether it is set.
func (o *Options) Require(names string, set ...bool) {
	list := strings.Split(names, ", ")
	for i, ok := range set {
		if i < len(list) {
			o.NotNil(ok, list[i])
		}
	}
}
