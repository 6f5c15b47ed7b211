package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/redis/go-redis/v9"
)

var _ ratelimit.Assigner = (*Store)(nil)

// logLength is the length a namespace's log of assignment changes is
// trimmed to, approximately (XADD MAXLEN ~): a reader whose cursor is
// older lists the whole set again.
const logLength = 10000

// assignScript sets a subject's assignment and logs the change, atomically.
//
//	KEYS[1]  the namespace's assignments: a hash of subject -> value
//	KEYS[2]  their log: a stream of entries {s: subject, v: value}
//	ARGV[1]  the subject
//	ARGV[2]  the value; "" removes the assignment
//	ARGV[3]  the length the log is trimmed to (MAXLEN ~)
//	reply    the value replaced, "" when none
//
// A value equal to the one held changes nothing and logs nothing.
var assignScript = redis.NewScript(`
local old = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if old == ARGV[2] then return old end
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 's', ARGV[1], 'v', ARGV[2])
return old
`)

// checkAssignment refuses an empty namespace or subject.
func checkAssignment(namespace, subject string) error {
	if rule := keyfmt.AssignmentRule(namespace, subject); rule != "" {
		return fmt.Errorf("%w: redisstore: %s", ratelimit.ErrInvalidArgument, rule)
	}
	return nil
}

// Assign sets subject's assignment in namespace to value ("" removes it)
// and logs the change, in one script call on the namespace's two keys (see
// Assigned), and returns the value replaced. The log, a stream, is trimmed
// to about its latest 10,000 changes.
func (s *Store) Assign(ctx context.Context, namespace, subject, value string) (string, error) {
	if err := checkAssignment(namespace, subject); err != nil {
		return "", err
	}
	hash, log := keyfmt.Assignments(namespace)
	old, err := assignScript.Run(ctx, s.client, []string{hash, log}, subject, value, logLength).Text()
	if err != nil {
		return "", wrapErr("assign", keyfmt.Prefix(namespace), err)
	}
	return old, nil
}

// Assigned returns subject's assignment in namespace, "" when none: a field
// of the hash "{<len>:<namespace>:}assignments" (whose log of changes is
// the stream "{<len>:<namespace>:}assignments:log"; both share a hash tag,
// so on Redis Cluster a namespace's assignments are one slot, which need
// not be the slot of any of its buckets).
func (s *Store) Assigned(ctx context.Context, namespace, subject string) (string, error) {
	if err := checkAssignment(namespace, subject); err != nil {
		return "", err
	}
	hash, _ := keyfmt.Assignments(namespace)
	v, err := s.client.HGet(ctx, hash, subject).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", wrapErr("assigned", keyfmt.Prefix(namespace), err)
	}
	return v, nil
}

// AssignmentsSince returns the changes of namespace's assignments after
// cursor, a stream entry ID, as ratelimit.Assigner says. The changes are
// one MULTI/EXEC of two XRANGEs: the cursor's own entry, which must still
// be in the log (else the log was trimmed past it, or Redis lost its data,
// and the whole set is listed), and the entries after it. The whole set is
// the log's last ID (XREVRANGE), then the hash by HSCAN: a change made
// during the scan comes after that ID, so the next call applies it again.
func (s *Store) AssignmentsSince(ctx context.Context, namespace, cursor string) (map[string]string, string, bool, error) {
	if err := checkAssignment(namespace, "-"); err != nil { // any subject: none is named
		return nil, "", false, err
	}
	hash, log := keyfmt.Assignments(namespace)
	if streamID(cursor) {
		var at, after *redis.XMessageSliceCmd
		_, err := s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
			at = p.XRange(ctx, log, cursor, cursor)
			after = p.XRange(ctx, log, "("+cursor, "+")
			return nil
		})
		if err != nil {
			return nil, "", false, wrapErr("assignments since", keyfmt.Prefix(namespace), err)
		}
		if len(at.Val()) == 1 {
			changes := make(map[string]string)
			next := cursor
			for _, m := range after.Val() {
				subject, _ := m.Values["s"].(string)
				value, _ := m.Values["v"].(string)
				if subject != "" {
					changes[subject] = value
				}
				next = m.ID
			}
			return changes, next, false, nil
		}
	}
	last, err := s.client.XRevRangeN(ctx, log, "+", "-", 1).Result()
	if err != nil {
		return nil, "", false, wrapErr("assignments", keyfmt.Prefix(namespace), err)
	}
	next := ""
	if len(last) == 1 {
		next = last[0].ID
	}
	all := make(map[string]string)
	var at uint64
	for {
		kv, c, err := s.client.HScan(ctx, hash, at, "", 1000).Result()
		if err != nil {
			return nil, "", false, wrapErr("assignments", keyfmt.Prefix(namespace), err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			all[kv[i]] = kv[i+1]
		}
		if at = c; at == 0 {
			return all, next, true, nil
		}
	}
}

// streamID reports whether id is a stream entry ID, "<ms>-<seq>".
func streamID(id string) bool {
	ms, seq, ok := strings.Cut(id, "-")
	if !ok {
		return false
	}
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return err1 == nil && err2 == nil
}
