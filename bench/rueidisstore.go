package main

import (
	"context"
	"fmt"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/redis/rueidis"
)

// RueidisStore is a prototype ratelimit.Store that runs our script through
// rueidis, whose auto-pipelining writes the commands of concurrent callers to
// a few shared connections in batches: the pipelining client path.
type RueidisStore struct {
	client rueidis.Client
	script *rueidis.Lua
}

// NewRueidisStore returns a RueidisStore over client.
func NewRueidisStore(client rueidis.Client) *RueidisStore {
	return &RueidisStore{client: client, script: rueidis.NewLuaScript(script.Source)}
}

// Apply decides r against the bucket at key: EVALSHA, and EVAL on NOSCRIPT.
func (s *RueidisStore) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if err := r.Validate(); err != nil {
		return ratelimit.Decision{}, err
	}
	args := argStrings(new(script.Encoder).Args(r))
	res := s.script.Exec(ctx, s.client, []string{key}, args)
	if packed, err := res.ToString(); err == nil {
		return script.ParseReply(r, packed) // a reply without an error
	}
	ints, err := res.AsIntSlice()
	if err != nil {
		return ratelimit.Decision{}, fmt.Errorf("ratelimit: redis check of %q: %w", key, err)
	}
	reply := make([]any, len(ints))
	for i, n := range ints {
		reply[i] = n
	}
	return script.ParseReply(r, reply)
}

// Reset deletes the bucket at key.
func (s *RueidisStore) Reset(ctx context.Context, key string) error {
	return s.client.Do(ctx, s.client.B().Del().Key(key).Build()).Error()
}
