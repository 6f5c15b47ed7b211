package envoyrls

import (
	"regexp"
	"strings"
	"time"
)

// PeerCounter is one of the peer's statistics: a counter that is told the
// hits to add (a github.com/lyft/gostats Counter is one).
type PeerCounter interface {
	Add(delta uint64)
}

// PeerTimer is one of the peer's timers: it is told each duration it
// measured (a github.com/lyft/gostats Timer is one).
type PeerTimer interface {
	AddDuration(d time.Duration)
}

// PeerStats returns the counter of one of the peer's statistics by its
// statsd name, such as "ratelimit.service.rate_limit.edge.remote_address.total_hits".
// Metrics asks for each name once, when it first counts under it, and keeps
// the counter; the same name always gets the same counter.
type PeerStats func(name string) PeerCounter

// The peer's statistics that are not a rule's (its src/stats and
// src/metrics): its statsd names, under which PeerStats is asked for them.
const (
	PeerConfigLoadSuccess = "ratelimit.service.config_load_success"
	PeerConfigLoadError   = "ratelimit.service.config_load_error"
	PeerGlobalShadowMode  = "ratelimit.service.global_shadow_mode"
	PeerRedisError        = "ratelimit.service.call.should_rate_limit.redis_error"
	PeerServiceError      = "ratelimit.service.call.should_rate_limit.service_error"
	PeerTotalRequests     = "ratelimit_server.ShouldRateLimit.total_requests"
	// PeerResponseTime is a timer, not a counter: see SetPeerTimer.
	PeerResponseTime = "ratelimit_server.ShouldRateLimit.response_time"
)

// peerRulePrefix begins a rule's statistics: the peer's
// "ratelimit.service.rate_limit.<key>.total_hits" and so on.
const peerRulePrefix = "ratelimit.service.rate_limit."

// peerCounters are the peer's statistics of one rule's key.
type peerCounters struct {
	hits, over, near, within, shadow PeerCounter
}

// peerService are the peer's statistics of the service.
type peerService struct {
	loadOK, loadError, globalShadow, redisError, serviceError, requests PeerCounter
}

// SetPeerStats makes m count the peer's statistics too, through p, from
// the same observation of each descriptor as its own series: the peer's
// names (its rules' keys rewritten as its SanitizeStatName rewrites them:
// ':' and '|' as '_', and the dots of an IPv4 address as '_'), and its
// choices where they differ from this service's series: hits of an
// unlimited rule are not counted, as the peer counts none. A request ending
// in an error of the store is the peer's redis_error, and one that is not
// valid its service_error; every ShouldRateLimit call is one of
// total_requests. Call it before m counts anything; nil counts none.
func (m *Metrics) SetPeerStats(p PeerStats) {
	if m == nil || p == nil {
		return
	}
	m.peer = p
	m.peerSvc = &peerService{
		loadOK: p(PeerConfigLoadSuccess), loadError: p(PeerConfigLoadError), globalShadow: p(PeerGlobalShadowMode),
		redisError: p(PeerRedisError), serviceError: p(PeerServiceError), requests: p(PeerTotalRequests),
	}
}

// SetPeerTimer makes m time every ShouldRateLimit call in t, the peer's
// response_time: each call total_requests counts (gRPC and /json, refused
// and failed ones too, as the peer's interceptor times every call it
// counts), from its start to its answer, read on now (time.Now when nil)
// once at each end. The peer's timer is in whole milliseconds: a milli
// timer of gostats makes the same values of the durations.
// Call it before m counts anything; nil times none and reads no clock.
func (m *Metrics) SetPeerTimer(t PeerTimer, now func() time.Time) {
	if m == nil || t == nil {
		return
	}
	if now == nil {
		now = time.Now
	}
	m.respTime, m.now = t, now
}

// callStarted returns the start of a ShouldRateLimit call, for callEnded;
// the zero time, without reading the clock, when no timer is set.
func (m *Metrics) callStarted() time.Time {
	if m == nil || m.respTime == nil {
		return time.Time{}
	}
	return m.now()
}

// callEnded tells the peer's response_time the duration of a call that
// started at start.
func (m *Metrics) callEnded(start time.Time) {
	if m != nil && m.respTime != nil {
		m.respTime.AddDuration(m.now().Sub(start))
	}
}

// peerRule returns the peer's counters of a rule's statistics key.
func (m *Metrics) peerRule(key string) *peerCounters {
	name := peerRulePrefix + SanitizeStatName(key)
	return &peerCounters{
		hits: m.peer(name + ".total_hits"), over: m.peer(name + ".over_limit"), near: m.peer(name + ".near_limit"),
		within: m.peer(name + ".within_limit"), shadow: m.peer(name + ".shadow_mode"),
	}
}

// ipv4 is the peer's pattern of an IPv4 address in a statistics key.
var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

var statReplacer = strings.NewReplacer(":", "_", "|", "_")

// SanitizeStatName rewrites a statistics key as the peer does before it
// names a statistic: ':' and '|' become '_', and so do the dots of
// anything shaped as an IPv4 address.
func SanitizeStatName(s string) string {
	return ipv4.ReplaceAllStringFunc(statReplacer.Replace(s), func(ip string) string {
		return strings.ReplaceAll(ip, ".", "_")
	})
}
