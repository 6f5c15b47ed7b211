// Package storehook lets the stores of this module offer the Limiter and
// package fallback what no user calls, with no method in the stores'
// documentation: a check whose key comes in two parts (memstore, and
// fallback passing it on), and the partitions of a Redis Cluster
// (redisstore, for fallback's liveness flag per master).
//
// A store embeds a Hooks and offers its functions with OfferSplit or
// OfferPartitions, once, in its constructor; the package that uses them
// finds them with Split or Partitions. Hooks has no exported field or
// method, so embedding it adds nothing a user of the store can call.
//
// R and D are always ratelimit.Request and ratelimit.Decision: this package
// cannot name them, since package ratelimit imports it.
package storehook

import "context"

// SplitFunc decides a check on the key prefix+subject exactly as the
// store's Apply of that key would, taking the key in two parts, which spares
// the caller the allocation of joining them (see OfferSplit).
type SplitFunc[R, D any] func(ctx context.Context, prefix, subject string, r R) (D, error)

// Hooks holds the functions a store offers; a nil one it does not offer.
// The zero Hooks offers none.
type Hooks[R, D any] struct {
	applySplit    SplitFunc[R, D]
	partition     func(ctx context.Context, key string) string
	pingPartition func(ctx context.Context, partition string) error
}

func (h *Hooks[R, D]) hooks() *Hooks[R, D] { return h }

// of returns the Hooks that store embeds, or nil.
func of[R, D any](store any) *Hooks[R, D] {
	if s, ok := store.(interface{ hooks() *Hooks[R, D] }); ok {
		return s.hooks()
	}
	return nil
}

// OfferSplit makes the store that embeds h take a key in two parts, with
// applySplit.
func OfferSplit[R, D any](h *Hooks[R, D], applySplit SplitFunc[R, D]) {
	h.applySplit = applySplit
}

// Split returns the applySplit that store offers (see OfferSplit), or nil.
func Split[R, D any](store any) SplitFunc[R, D] {
	if h := of[R, D](store); h != nil {
		return h.applySplit
	}
	return nil
}

// OfferPartitions makes the store that embeds h report its partitions,
// parts that fail on their own (a Redis Cluster's masters): partition names
// the partition that keeps key, read without I/O, and ping checks one
// partition. A store that is one partition offers none.
func OfferPartitions[R, D any](h *Hooks[R, D], partition func(ctx context.Context, key string) string, ping func(ctx context.Context, partition string) error) {
	h.partition, h.pingPartition = partition, ping
}

// Partitions returns the functions store offers with OfferPartitions, or
// nil ones.
func Partitions[R, D any](store any) (partition func(ctx context.Context, key string) string, ping func(ctx context.Context, partition string) error) {
	if h := of[R, D](store); h != nil {
		return h.partition, h.pingPartition
	}
	return nil, nil
}
