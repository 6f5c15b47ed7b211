package cli

import (
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/exactlimit/ratelimit/internal/service"
)

// readPeerStats reads the peer's statistics settings through getenv:
// DISABLE_STATS, USE_STATSD with STATSD_HOST, STATSD_PORT (and gostats'
// own STATSD_PROTOCOL, tcp or udp), USE_PROMETHEUS with PROMETHEUS_ADDR,
// PROMETHEUS_PATH and PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS (which the
// peer reads with Prometheus only), STATS_FLUSH_INTERVAL and EXTRA_TAGS.
// USE_STATSD is true by default, as the peer's, only when serve runs as the
// peer's container (container: readPeerListen's envoy); otherwise the
// statistics are sent only when asked for. It returns nil when none are to be sent. What the
// peer refuses (more than one sink), and what this service cannot do
// (USE_DOG_STATSD, PROMETHEUS_MAPPER_YAML, EXTRA_TAGS with Prometheus), is
// a usage error naming the setting. checkPeerSettings has refused a
// boolean, number or duration that does not parse.
func readPeerStats(getenv func(string) string, container bool) (*service.PeerStats, error) {
	if getenv == nil {
		return nil, nil
	}
	get := func(name string) string { return strings.TrimSpace(getenv(name)) }
	boolean := func(name string, def bool) bool {
		if v := get(name); v != "" {
			b, _ := strconv.ParseBool(v)
			return b
		}
		return def
	}
	if boolean("DISABLE_STATS", false) {
		return nil, nil
	}
	useStatsd, useProm := boolean("USE_STATSD", container), boolean("USE_PROMETHEUS", false)
	switch {
	case boolean("USE_DOG_STATSD", false):
		return nil, usagef("USE_DOG_STATSD=true is not supported: set USE_STATSD=true (plain statsd) or USE_PROMETHEUS=true (see docs/envoy.md)")
	case useStatsd && useProm:
		return nil, usagef("USE_STATSD and USE_PROMETHEUS are both true: one stats sink at a time, as the peer refuses both (USE_STATSD is true by default: set USE_STATSD=false)")
	case !useStatsd && !useProm:
		return nil, nil
	}
	p := &service.PeerStats{FlushInterval: service.DefaultPeerStatsFlush}
	if v := get("STATS_FLUSH_INTERVAL"); v != "" {
		d, _ := time.ParseDuration(v)
		if d <= 0 {
			return nil, usagef("STATS_FLUSH_INTERVAL=%q: want a positive duration", v)
		}
		p.FlushInterval = d
	}
	if v := get("EXTRA_TAGS"); v != "" {
		if useProm {
			return nil, usagef("EXTRA_TAGS with USE_PROMETHEUS=true is not supported: the peer's Prometheus names carry no extra labels here")
		}
		p.Tags = map[string]string{}
		for pair := range strings.SplitSeq(v, ",") {
			k, val, ok := strings.Cut(strings.TrimSpace(pair), ":")
			if !ok || k == "" {
				return nil, usagef("EXTRA_TAGS=%q: want key:value,key:value", v)
			}
			p.Tags[k] = val
		}
	}
	if useStatsd {
		host, port := get("STATSD_HOST"), get("STATSD_PORT")
		if host == "" {
			host = "localhost"
		}
		if port == "" {
			port = "8125"
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return nil, usagef("STATSD_PORT=%q: want a port number from 1 to 65535", port)
		}
		p.Statsd = net.JoinHostPort(host, port)
		switch proto := strings.ToLower(get("STATSD_PROTOCOL")); proto {
		case "", "tcp":
			p.StatsdProtocol = "tcp"
		case "udp":
			p.StatsdProtocol = "udp"
		default:
			return nil, usagef("STATSD_PROTOCOL=%q: want tcp or udp", proto)
		}
		return p, nil
	}
	if get("PROMETHEUS_MAPPER_YAML") != "" {
		return nil, usagef("PROMETHEUS_MAPPER_YAML is not supported: the peer's default mapping is the one served (see docs/envoy.md)")
	}
	p.Prometheus, p.PrometheusPath = get("PROMETHEUS_ADDR"), get("PROMETHEUS_PATH")
	p.ResponseTimeAsMilliseconds = boolean("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", false)
	if p.Prometheus == "" {
		p.Prometheus = ":9090"
	}
	if p.PrometheusPath == "" {
		p.PrometheusPath = "/metrics"
	}
	if !strings.HasPrefix(p.PrometheusPath, "/") {
		return nil, usagef("PROMETHEUS_PATH=%q: want a path beginning with /", p.PrometheusPath)
	}
	return p, nil
}
