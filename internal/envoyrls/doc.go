// Package envoyrls answers Envoy's global rate limiting API,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, from
// configuration files in envoyproxy/ratelimit's format, with exact token
// buckets instead of that service's fixed windows.
//
// Each rate_limit block is a bucket of requests_per_unit tokens (or burst,
// this package's extension) that refills requests_per_unit every unit,
// smoothly. Units are the peer's: second, minute, hour, day, week, month (30
// days) and year (365 days). A rule's buckets live in a namespace of their
// own, built from the domain and the rule's path with every part framed by its
// length, and the subject is the request's values where the rule leaves them
// open; so no two rules, and no two domains, share a key.
//
// Matching follows the peer: at each level the entry's key and value, then
// wildcard values in file order, then the key alone; a rule applies only at
// the descriptor's last entry. replaces, shadow_mode, unlimited,
// share_threshold, detailed_metric and value_to_metric mean what the peer's
// README says; a descriptor's own limit and hits_addend are honoured.
//
// A request is decided all or nothing: when any descriptor's bucket lacks
// its cost (and the rule is not in shadow mode), the answer is OVER_LIMIT and
// no bucket is charged. The statuses count the descriptors in turn, as the
// peer does, against the balances the request found. On a ratelimit.BatchStore that is one ApplyAll call;
// other stores get a sequential path (see applyAll). A Service is safe for
// simultaneous use by multiple goroutines and starts no goroutine (Watch
// runs in its caller's).
package envoyrls
