package cli

import (
	"context"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/service"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// TestPeerRedisOptions: the peer's Redis settings become the same go-redis
// options as --redis, with the limiter's settings.
func TestPeerRedisOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		vars map[string]string
		want string // service.DescribeRedis of the options
		user string
		pass string
		pool int
		tls  bool
	}{
		{"no setting: no Redis", nil, "", "", "", 0, false},
		{"BACKEND_TYPE=redis alone: the peer's default socket", map[string]string{"BACKEND_TYPE": "redis"},
			"redis /var/run/nutcracker/ratelimit.sock", "", "", 0, false},
		{"tcp, a password and a pool", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "REDIS_AUTH": "s3cret", "REDIS_POOL_SIZE": "20"},
			"redis redis:6379", "", "s3cret", 20, false},
		{"a user and a password", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "REDIS_AUTH": "app:s3cret"},
			"redis redis:6379", "app", "s3cret", 0, false},
		{"a cluster, in the peer's upper case", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "CLUSTER", "REDIS_URL": "a:7000,b:7001"},
			"redis cluster a:7000,b:7001", "", "", 0, false},
		{"a sentinel", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "Sentinel", "REDIS_URL": "mymaster,s1:26379,s2:26379"},
			"redis sentinel master mymaster via s1:26379,s2:26379", "", "", 0, false},
		{"TLS", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "REDIS_TLS": "true"},
			"redis (TLS) redis:6379", "", "", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := readPeerRedis(func(k string) string { return tc.vars[k] }, false)
			if err != nil {
				t.Fatal(err)
			}
			if p.opts == nil {
				if tc.want != "" {
					t.Fatalf("no Redis, want %s", tc.want)
				}
				return
			}
			o := p.opts
			if got := service.DescribeRedis(o); got != tc.want {
				t.Errorf("Redis %q, want %q", got, tc.want)
			}
			if o.Username != tc.user || o.Password != tc.pass || o.PoolSize != tc.pool || (o.TLSConfig != nil) != tc.tls {
				t.Errorf("user %q password %q pool %d TLS %v; want %q %q %d %v", o.Username, o.Password, o.PoolSize, o.TLSConfig != nil, tc.user, tc.pass, tc.pool, tc.tls)
			}
			if o.MaxRetries != -1 || !o.ContextTimeoutEnabled || o.DialerRetries != 1 {
				t.Errorf("limiter settings missing: MaxRetries %d ContextTimeoutEnabled %v DialerRetries %d", o.MaxRetries, o.ContextTimeoutEnabled, o.DialerRetries)
			}
		})
	}
}

// TestPeerRedisSentinelAuth: REDIS_AUTH is the master's credentials and
// REDIS_SENTINEL_AUTH the sentinels', each password or user:password.
func TestPeerRedisSentinelAuth(t *testing.T) {
	vars := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "sentinel", "REDIS_URL": "m,s1:26379",
		"REDIS_AUTH": "app:pw", "REDIS_SENTINEL_AUTH": "spw"}
	p, err := readPeerRedis(func(k string) string { return vars[k] }, false)
	if err != nil {
		t.Fatal(err)
	}
	o := p.opts
	if o.Username != "app" || o.Password != "pw" || o.SentinelUsername != "" || o.SentinelPassword != "spw" {
		t.Errorf("master %q:%q, sentinels %q:%q; want app:pw and :spw", o.Username, o.Password, o.SentinelUsername, o.SentinelPassword)
	}
}

// TestServeRefusesABadPeerSetting: a value serve cannot take stops it
// before it listens, with exit 2 and a message naming the variable.
func TestServeRefusesABadPeerSetting(t *testing.T) {
	p := testkit.NewPKI(t)
	for _, tc := range []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{"REDIS_TYPE": "foo"}, `REDIS_TYPE="foo": want single, cluster or sentinel`},
		{map[string]string{"REDIS_SOCKET_TYPE": "udp"}, `REDIS_SOCKET_TYPE="udp": want tcp or unix`},
		{map[string]string{"REDIS_POOL_SIZE": "-1"}, `REDIS_POOL_SIZE="-1"`},
		{map[string]string{"REDIS_POOL_SIZE": "ten"}, `REDIS_POOL_SIZE="ten"`},
		{map[string]string{"REDIS_TLS": "maybe"}, `REDIS_TLS="maybe": want true or false`},
		{map[string]string{"REDIS_TIMEOUT": "10"}, `REDIS_TIMEOUT="10"`},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "/tmp/redis.sock"}, `REDIS_URL="/tmp/redis.sock": with REDIS_SOCKET_TYPE=tcp, want host:port`},
		{map[string]string{"REDIS_URL": "redis:6379"}, `REDIS_URL="redis:6379" is host:port, but REDIS_SOCKET_TYPE is unix (the peer's default): set REDIS_SOCKET_TYPE=tcp`},
		{map[string]string{"REDIS_URL": "redis://u:s3cret@redis:6379"}, `REDIS_URL="redis://u:xxxxx@redis:6379": a URL`},
		{map[string]string{"REDIS_TYPE": "sentinel", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "127.0.0.1:26379"}, "want mastername,host:port"},
		{map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": "/tmp/redis.sock"}, "REDIS_SOCKET_TYPE=unix needs REDIS_TYPE=single"},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_TLS": "true", "REDIS_TLS_CACERT": "/nonexistent.pem"}, "REDIS_TLS_CACERT"},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_TLS": "true", "REDIS_TLS_CACERT": p.ServerKey}, "REDIS_TLS_CACERT"},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_TLS": "true", "REDIS_TLS_CLIENT_CERT": p.ServerCert}, "give both or neither"},
		{map[string]string{"BACKEND_TYPE": "memcache"}, "BACKEND_TYPE=memcache is not supported"},
		{map[string]string{"BACKEND_TYPE": "etcd"}, `BACKEND_TYPE="etcd": want redis`},
		{map[string]string{"REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "r2:6379"}, "REDIS_PERSECOND=true is not supported"},
		{map[string]string{"REDIS_POOL_ON_EMPTY_BEHAVIOR": "CREATE"}, "REDIS_POOL_ON_EMPTY_BEHAVIOR=CREATE is not supported"},
		{map[string]string{"NEAR_LIMIT_RATIO": "0"}, `NEAR_LIMIT_RATIO="0": want a number above 0 and at most 1`},
		{map[string]string{"NEAR_LIMIT_RATIO": "1.5"}, `NEAR_LIMIT_RATIO="1.5"`},
		{map[string]string{"NEAR_LIMIT_RATIO": "most"}, `NEAR_LIMIT_RATIO="most": want a number`},
		{map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "yes"}, `LIMIT_RESPONSE_HEADERS_ENABLED="yes": want true or false`},
		{map[string]string{"USE_STATSD": "perhaps"}, `USE_STATSD="perhaps"`},
		{map[string]string{"EXPIRATION_JITTER_MAX_SECONDS": "5m"}, `EXPIRATION_JITTER_MAX_SECONDS="5m": want a whole number`},
		{map[string]string{"GRPC_MAX_CONNECTION_AGE": "1d"}, `GRPC_MAX_CONNECTION_AGE="1d": want a duration`},
		{map[string]string{"GRPC_UDS": "/tmp/rl.sock"}, "GRPC_UDS=/tmp/rl.sock is not supported"},
		{map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"}, "CONFIG_TYPE=GRPC_XDS_SOTW is not supported"},
	} {
		var name []string
		for k, v := range tc.vars {
			name = append(name, k+"="+v)
		}
		t.Run(strings.Join(name, " "), func(t *testing.T) {
			var stdout, stderr testkit.Buffer
			env := Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return tc.vars[k] }}
			code := Main(context.Background(), []string{"serve", "--listen", "127.0.0.1:0"}, env)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("got exit %d and %q, want 2 and %q", code, stderr.String(), tc.want)
			}
		})
	}
}

// peerEnvoy starts serve with the Envoy service of a rule of rpu requests a
// minute per remote_address, with the peer's settings vars and no Redis
// flag.
func peerEnvoy(t *testing.T, vars map[string]string, rpu string, args ...string) *envoyServe {
	t.Helper()
	path := filepath.Join(t.TempDir(), "edge.yaml")
	writeEnvoyConfig(t, path, rpu)
	return startServeEnvoy(t, vars, append([]string{"--envoy-config", path}, args...)...)
}

// admitted sends n requests of ip, spread over the services in turn, and
// returns how many were OK.
func admitted(t *testing.T, n int, ip string, services ...*envoyServe) int {
	t.Helper()
	ok := 0
	for i := range n {
		r, err := services[i%len(services)].ask(t, ip)
		if err != nil {
			t.Fatal(err)
		}
		if r.OverallCode == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

// keys returns the keys of the Redis at addr that match pattern (KEYS).
func keys(t *testing.T, addr, pattern string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ks, err := redistest.Client(t, addr).Keys(ctx, pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

// TestServeRedisFromThePeersSettings: with only the peer's settings
// (REDIS_SOCKET_TYPE, REDIS_TYPE, REDIS_URL, REDIS_AUTH) the Envoy service
// keeps its buckets in that Redis: a standalone one over TCP, one over a unix
// socket, one behind a Sentinel. Two replicas on one Redis share a rule of 5
// a minute: exactly 5 are admitted across both.
func TestServeRedisFromThePeersSettings(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts redis-server")
	}
	tcp := redistest.StartServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := redistest.Client(t, tcp.Addr()).ConfigSet(ctx, "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	unix := redistest.StartUnixServer(t)
	master := redistest.StartServer(t)
	sentinel := redistest.StartSentinel(t, "mymaster", master)
	cluster := redistest.StartCluster(t, 3, 0)
	for _, tc := range []struct {
		name string
		vars map[string]string
		addr string // where the buckets must be ("": somewhere in the cluster)
		log  string // a line the log must hold besides
	}{
		{"a Cluster", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "cluster", "REDIS_URL": strings.Join(cluster.Addrs(), ",")}, "", `redis="redis cluster `},
		{"a standalone Redis over TCP with a password",
			map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": tcp.Addr(), "REDIS_AUTH": "s3cret", "REDIS_TLS_CACERT": "/nonexistent/ca.pem"},
			tcp.Addr(), `level=WARN msg="ignored, as the peer ignores it: REDIS_TLS_CACERT applies only with REDIS_TLS=true"`},
		{"a Redis on a unix socket", map[string]string{"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": unix.Socket(), "REDIS_POOL_SIZE": "4", "RATELIMIT_OUTAGE": "fail-open"},
			unix.Addr(), `redis="redis ` + unix.Socket()},
		{"a Sentinel set-up", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster," + sentinel.Addr()},
			master.Addr(), `redis="redis sentinel master mymaster via ` + sentinel.Addr()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ip := strings.ReplaceAll(tc.name, " ", "-")
			a, b := peerEnvoy(t, tc.vars, "5"), peerEnvoy(t, tc.vars, "5")
			if got := admitted(t, 10, ip, a, b); got != 5 {
				t.Errorf("two replicas admitted %d of a rule of 5 a minute, want 5 across both", got)
			}
			for _, want := range []string{`msg="Redis from the peer's settings"`, tc.log} {
				if !strings.Contains(a.stderr.String(), want) {
					t.Errorf("the log lacks %s:\n%s", want, a.stderr.String())
				}
			}
			if strings.Contains(a.stderr.String(), "keeps its buckets in this process") {
				t.Errorf("the log warns of the embedded store:\n%s", a.stderr.String())
			}
			addrs := []string{tc.addr}
			if tc.addr == "" {
				addrs = cluster.Addrs()
			}
			var found []string
			for _, addr := range addrs {
				found = append(found, keysWith(t, addr, tc.vars["REDIS_AUTH"], "*"+ip)...)
			}
			if len(found) != 1 {
				t.Errorf("buckets of %s in %v: %v, want one", ip, addrs, found)
			}
		})
	}
}

// keysWith is keys with a password.
func keysWith(t *testing.T, addr, password, pattern string) []string {
	t.Helper()
	if password == "" {
		return keys(t, addr, pattern)
	}
	o := redistest.ClientOptions(addr)
	o.Password = password
	client := newClient(o)
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ks, err := client.Keys(ctx, pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

// TestServeEnvoyWarnsOfTheEmbeddedStore: with no Redis from a flag or the
// peer's settings, the log warns that replicas do not share the buckets.
func TestServeEnvoyWarnsOfTheEmbeddedStore(t *testing.T) {
	e := peerEnvoy(t, nil, "5")
	if !strings.Contains(e.stderr.String(), `level=WARN msg="the Envoy service keeps its buckets in this process`) {
		t.Errorf("no warning of the embedded store:\n%s", e.stderr.String())
	}
}

// TestServeRedisFlagWinsOverThePeers: --redis (or RATELIMIT_REDIS) beside
// REDIS_URL is the Redis used, and the log warns naming both.
func TestServeRedisFlagWinsOverThePeers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts redis-server")
	}
	flagged, peer := redistest.StartServer(t), redistest.StartServer(t)
	vars := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": peer.Addr()}
	for _, tc := range []struct {
		name string
		vars map[string]string
		args []string
	}{
		{"--redis", vars, []string{"--redis", "redis://" + flagged.Addr()}},
		{"RATELIMIT_REDIS", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": peer.Addr(), "RATELIMIT_REDIS": "redis://" + flagged.Addr()}, nil},
		{"--redis beside a platform's REDIS_URL, a URL the peer could not take",
			map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis://" + peer.Addr()}, []string{"--redis", "redis://" + flagged.Addr()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := peerEnvoy(t, tc.vars, "5", tc.args...)
			if got := admitted(t, 1, tc.name, e); got != 1 {
				t.Fatalf("admitted %d, want 1", got)
			}
			for _, want := range []string{"level=WARN", "flag=--redis", "env=RATELIMIT_REDIS", "overrides=REDIS_SOCKET_TYPE,REDIS_URL"} {
				if !strings.Contains(e.stderr.String(), want) {
					t.Errorf("the log lacks %q:\n%s", want, e.stderr.String())
				}
			}
			if len(keys(t, flagged.Addr(), "*envoy*")) == 0 || len(keys(t, peer.Addr(), "*")) != 0 {
				t.Errorf("the buckets are not in --redis's server alone: %v there, %v in REDIS_URL's", keys(t, flagged.Addr(), "*"), keys(t, peer.Addr(), "*"))
			}
		})
	}
}

// TestServeCacheKeyPrefix: CACHE_KEY_PREFIX begins every key the Envoy
// service writes. Two services on one Redis with different prefixes do not
// share a rule's bucket (each admits the rule's 5); with the same prefix they
// do (5 across both).
func TestServeCacheKeyPrefix(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts redis-server")
	}
	srv := redistest.StartServer(t)
	redis := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr()}
	with := func(prefix string) map[string]string {
		vars := map[string]string{"CACHE_KEY_PREFIX": prefix}
		for k, v := range redis {
			vars[k] = v
		}
		return vars
	}
	for _, tc := range []struct {
		name     string
		a, b     string
		admitted int
	}{
		{"different prefixes", "blue:", "green:", 10},
		{"the same prefix", "blue:", "blue:", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ip := strings.ReplaceAll(tc.name, " ", "-")
			a, b := peerEnvoy(t, with(tc.a), "5"), peerEnvoy(t, with(tc.b), "5")
			if got := admitted(t, 20, ip, a, b); got != tc.admitted {
				t.Errorf("admitted %d across both, want %d", got, tc.admitted)
			}
		})
	}
	// The prefix begins the namespace, which the key frames by its length
	// (package ratelimit's key layout).
	framed := regexp.MustCompile(`^[0-9]+:(blue|green):envoy:`)
	for _, k := range keys(t, srv.Addr(), "*") {
		if !framed.MatchString(k) {
			t.Errorf("key %q is not under a prefix", k)
		}
	}
}

// TestServeRedisTLSFromThePeersSettings: REDIS_TLS with the peer's PEM files
// reaches a Redis that requires client certificates; the server's name is
// checked unless REDIS_TLS_SKIP_HOSTNAME_VERIFICATION, and its chain always.
func TestServeRedisTLSFromThePeersSettings(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts redis-server")
	}
	p := testkit.NewPKI(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	srv := redistest.StartServer(t, "--tls-port", port, "--tls-cert-file", p.ServerCert, "--tls-key-file", p.ServerKey,
		"--tls-ca-cert-file", p.ClientCA, "--tls-auth-clients", "yes")
	vars := func(host, ca string, skip bool) map[string]string {
		return map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": host + ":" + port, "REDIS_TLS": "true",
			"REDIS_TLS_CACERT": ca, "REDIS_TLS_CLIENT_CERT": p.ClientCert, "REDIS_TLS_CLIENT_KEY": p.ClientKey,
			"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": strconv.FormatBool(skip)}
	}
	for _, tc := range []struct {
		name   string
		vars   map[string]string
		served bool
	}{
		{"the server's name and chain checked", vars("127.0.0.1", p.ClientCA, false), true},
		{"a name the certificate does not hold", vars("localhost", p.ClientCA, false), false},
		{"a name the certificate does not hold, not checked", vars("localhost", p.ClientCA, true), true},
		{"a chain to another CA, the name not checked", vars("127.0.0.1", p.OtherCA, true), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ip := strings.ReplaceAll(tc.name, " ", "-")
			e := peerEnvoy(t, tc.vars, "5")
			_, err := e.ask(t, ip)
			if served := err == nil; served != tc.served {
				t.Fatalf("served %v (%v), want %v:\n%s", served, err, tc.served, e.stderr.String())
			}
			if !tc.served && (status.Code(err) != codes.Unavailable || !strings.Contains(e.stderr.String(), "x509: certificate")) {
				t.Errorf("got %v, want UNAVAILABLE for the server's certificate:\n%s", err, e.stderr.String())
			}
			if tc.served && len(keys(t, srv.Addr(), "*"+ip)) != 1 {
				t.Errorf("no bucket in the Redis behind TLS: %v", keys(t, srv.Addr(), "*"))
			}
		})
	}
}
