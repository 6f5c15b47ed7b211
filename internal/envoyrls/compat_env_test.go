//go:build envoycompat

package envoyrls

// The side-by-side test's environment cases: both services started as
// processes from one environment, the peer's binary and `ratelimit serve`
// built from ./cmd/ratelimit and started with no flags, each deployment
// with ports of its own and each side with a redis-server of its own (the
// deployments of one side share it), and every other setting the same.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// envCase is a case of the services started from one environment. When the
// processes of a deployment do not both serve, what is compared is whether
// each serves, refuses (exits) or neither; otherwise the steps' answers.
type envCase struct {
	name string
	// env are the settings beyond envBase's, the same on both sides.
	env map[string]string
	// deps are the deployments, each a process a side with these settings
	// beyond env; none is one deployment.
	deps []map[string]string
	// files are laid under RUNTIME_ROOT (RUNTIME_SUBDIRECTORY is
	// "ratelimit"): path: content.
	files map[string]string
	steps []envStep
	// legit names the difference of docs/envoy.md's "What differs" the
	// case may show; "" means none may show but the always legitimate ones.
	legit string
	// wait bounds the wait for a process to serve or exit (default 20s);
	// one that does neither by then neither serves nor refuses.
	wait time.Duration
}

// envStep is one step of an envCase, sent to both sides' deployment dep.
type envStep struct {
	dep int
	// req is a ShouldRateLimit call; with at, it is sent at times at once,
	// spread over the deployments in turn, and the OK answers are counted.
	req *rlsv3.RateLimitRequest
	at  int
	// want is the overall code the case expects of both sides' answer to
	// req ("" any), and admit the OK answers of at calls: what the case
	// shows (two prefixes keep apart, two replicas share) is checked on
	// each side, not only compared.
	want  rlsv3.RateLimitResponse_Code
	admit int
	// get is a path of the debug listener whose lines are compared, as a
	// set (the peer prints its rules in no order).
	get string
	// stats compares the peer's statistics scraped from PROMETHEUS_ADDR
	// (the case sets USE_PROMETHEUS=true).
	stats bool
}

func call(dep int, r *rlsv3.RateLimitRequest) envStep { return envStep{dep: dep, req: r, want: -1} }

// calls sends r n times to deployment dep.
func calls(n, dep int, r *rlsv3.RateLimitRequest) []envStep {
	out := make([]envStep, n)
	for i := range out {
		out[i] = call(dep, r)
	}
	return out
}

// expect sets the overall code expected of each step, in order.
func expect(s []envStep, codes ...rlsv3.RateLimitResponse_Code) []envStep {
	for i, c := range codes {
		s[i].want = c
	}
	return s
}

func steps(groups ...[]envStep) []envStep { return slices.Concat(groups...) }

// promStats are the settings of a case that compares the statistics.
func promStats(env map[string]string) map[string]string {
	out := map[string]string{"USE_PROMETHEUS": "true", "STATS_FLUSH_INTERVAL": "100ms"}
	for k, v := range env {
		out[k] = v
	}
	return out
}

// peerExamples are the peer's shipped examples/ratelimit/config, laid out
// as its container reads them.
func peerExamples(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, name := range []string{"config.yaml", "example.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata", "peer", "examples", name))
		if err != nil {
			t.Fatal(err)
		}
		out["ratelimit/config/"+name] = string(b)
	}
	return out
}

func rule(domain, body string) map[string]string {
	return map[string]string{"ratelimit/config/" + domain + ".yaml": "domain: " + domain + "\ndescriptors:\n" + body}
}

func envCases(t *testing.T) []envCase {
	kp := rule("kp", "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
	rep := rule("rep", "  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	near := rule("near", "  - key: n\n    rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: t\n    rate_limit: {unit: hour, requests_per_unit: 10}\n")
	bad := rule("bad", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	examples := peerExamples(t)
	refuse := func(name string, env map[string]string, legit string) envCase {
		return envCase{name: name, env: env, files: bad, legit: legit, steps: calls(2, 0, req("bad", 0, d("a=1")))}
	}
	return []envCase{
		{name: "CACHE_KEY_PREFIX: two deployments, prefixes blue_ and green_, on one Redis keep apart",
			deps: []map[string]string{{"CACHE_KEY_PREFIX": "blue_"}, {"CACHE_KEY_PREFIX": "green_"}}, files: kp,
			steps: expect(steps(calls(3, 0, req("kp", 0, d("user=u"))), calls(3, 1, req("kp", 0, d("user=u")))), ok, ok, over, ok, ok, over)},
		{name: "CACHE_KEY_PREFIX: two deployments, both blue_, on one Redis share",
			deps: []map[string]string{{"CACHE_KEY_PREFIX": "blue_"}, {"CACHE_KEY_PREFIX": "blue_"}}, files: kp,
			steps: expect(steps(calls(2, 0, req("kp", 0, d("user=u"))), calls(2, 1, req("kp", 0, d("user=u")))), ok, ok, over, over)},
		{name: "two replicas on one Redis, 5 a minute: 10 calls in turn, statistics of each",
			env: promStats(nil), deps: []map[string]string{{}, {}}, files: rep,
			steps: func() []envStep {
				var out []envStep
				for i := range 10 {
					out = append(out, call(i%2, req("rep", 0, d("user=u"))))
				}
				out = expect(out, ok, ok, ok, ok, ok, over, over, over, over, over)
				return append(out, envStep{dep: 0, stats: true}, envStep{dep: 1, stats: true})
			}()},
		{name: "two replicas on one Redis, 5 a minute: 20 calls at once admit 5",
			deps: []map[string]string{{}, {}}, files: rep,
			steps: expect([]envStep{{req: req("rep", 0, d("user=v")), at: 20, admit: 5, want: -1}, call(0, req("rep", 0, d("user=v"))), call(1, req("rep", 0, d("user=v")))}, -1, over, over)},
		{name: "LIMIT_RESPONSE_HEADERS_ENABLED, LIMIT_REMAINING_HEADER, NEAR_LIMIT_RATIO=0.57, statistics",
			env: promStats(map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_REMAINING_HEADER": "X-Left", "NEAR_LIMIT_RATIO": "0.57"}), files: near,
			steps: []envStep{call(0, req("near", 57, d("n=1"))), call(0, req("near", 40, d("n=1"))), call(0, req("near", 5, d("n=1"))),
				call(0, req("near", 3, d("t=1"), d("n=2"))), {stats: true}}},
		{name: "NEAR_LIMIT_RATIO=1, statistics",
			env: promStats(map[string]string{"NEAR_LIMIT_RATIO": "1"}), files: near,
			steps: []envStep{call(0, req("near", 9, d("t=1"))), call(0, req("near", 1, d("t=1"))), call(0, req("near", 1, d("t=1"))), {stats: true}}},
		refuse("NEAR_LIMIT_RATIO=abc: both refuse", map[string]string{"NEAR_LIMIT_RATIO": "abc"}, ""),
		refuse("NEAR_LIMIT_RATIO=1.5: the peer serves, ours refuses", map[string]string{"NEAR_LIMIT_RATIO": "1.5"}, "startup"),
		refuse("LIMIT_RESPONSE_HEADERS_ENABLED=maybe: both refuse", map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "maybe"}, ""),
		refuse("PORT=eighty: both refuse", map[string]string{"PORT": "eighty"}, ""),
		refuse("DEBUG_PORT=70000: the peer serves without its debug listener, ours refuses", map[string]string{"DEBUG_PORT": "70000"}, "startup"),
		refuse("REDIS_SOCKET_TYPE=bogus, REDIS_STARTUP_MAX_ELAPSED_TIME=1s: both refuse",
			map[string]string{"REDIS_SOCKET_TYPE": "bogus", "REDIS_STARTUP_MAX_ELAPSED_TIME": "1s"}, ""),
		func() envCase {
			c := refuse("REDIS_SOCKET_TYPE=bogus: neither serves (the peer retries)", map[string]string{"REDIS_SOCKET_TYPE": "bogus"}, "startup")
			c.wait = 5 * time.Second
			return c
		}(),
		{name: "the peer's examples/ratelimit/config (quota_mode): loads, /rlconfig, answers", files: examples,
			steps: steps([]envStep{{get: "/rlconfig"}},
				calls(1, 0, req("mongo_cps", 0, d("database=users"))), // 500 a second: a second call would show the refill
				calls(3, 0, req("rl", 0, d("foo=x", "bar=bkthomps"), d("category=account"))),
				calls(2, 0, req("rl", 0, d("foo=x", "bar=banned"))),
				calls(2, 0, req("rl", 0, d("foo=x", "baz=shady"))),
				calls(3, 0, req("rl", 0, d("unspec=a"))),
				calls(2, 0, req("rl", 0, d("service=service_1"))))},
		{name: "the peer's examples/ratelimit/config: two quota_mode descriptors", files: examples, legit: "quota-mode",
			steps: calls(3, 0, req("rl", 0, d("service=service_1"), d("service=service_2")))},
		{name: "RUNTIME_APPDIRECTORY=rules, RUNTIME_IGNOREDOTFILES=true",
			env: map[string]string{"RUNTIME_APPDIRECTORY": "rules", "RUNTIME_IGNOREDOTFILES": "true"},
			files: map[string]string{
				"ratelimit/rules/ap1.yaml":          "domain: ap1\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
				"ratelimit/rules/.ap2.yaml":         "domain: ap2\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
				"ratelimit/rules/sub/ap3.yaml":      "domain: ap3\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
				"ratelimit/rules/.hidden/ap5.yaml":  "domain: ap5\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
				"ratelimit/config/ap4.yaml":         "domain: ap4\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
				"ratelimit/rules/sub/.ap6.yaml":     "domain: ap6\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
				"ratelimit/rules/sub/deeper/a7.yml": "domain: ap7\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
			},
			steps: func() []envStep {
				out := []envStep{{get: "/rlconfig"}}
				// Loaded: ap1, ap3 and ap7 (the second call over);
				// left out: the dot files and directories, and config/.
				for dom, loaded := range map[string]bool{"ap1": true, "ap2": false, "ap3": true, "ap4": false, "ap5": false, "ap6": false, "ap7": true} {
					second := ok
					if loaded {
						second = over
					}
					out = append(out, expect(calls(2, 0, req(dom, 0, d("a=1"))), ok, second)...)
				}
				return out
			}()},
		{name: "MERGE_DOMAIN_CONFIG=true: one domain in two files",
			env: map[string]string{"MERGE_DOMAIN_CONFIG": "true"},
			files: map[string]string{
				"ratelimit/config/mg-a.yaml": "domain: mg\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
				"ratelimit/config/mg-b.yaml": "domain: mg\ndescriptors:\n  - {key: b, rate_limit: {unit: hour, requests_per_unit: 2}}\n",
			},
			steps: steps([]envStep{{get: "/rlconfig"}}, expect(calls(2, 0, req("mg", 0, d("a=1"))), ok, over), expect(calls(3, 0, req("mg", 0, d("b=1"))), ok, ok, over))},
		{name: "MERGE_DOMAIN_CONFIG unset: one domain in two files: the peer serves no config, ours refuses", legit: "startup",
			files: map[string]string{
				"ratelimit/config/mg-a.yaml": "domain: mg\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
				"ratelimit/config/mg-b.yaml": "domain: mg\ndescriptors:\n  - {key: b, rate_limit: {unit: hour, requests_per_unit: 2}}\n",
			},
			steps: steps([]envStep{{get: "/rlconfig"}}, calls(2, 0, req("mg", 0, d("a=1"))))},
	}
}

// buildOurs builds ./cmd/ratelimit into a directory of t's and returns the
// binary's path.
func buildOurs(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ratelimit")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/ratelimit")
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building ./cmd/ratelimit: %v\n%s", err, out)
	}
	return bin
}

// envProc is one process of a side.
type envProc struct {
	cmd                    *exec.Cmd
	http, grpc, debug, pro int
	log                    string
	exited                 chan struct{}
	err                    error // once exited
	client                 rlsv3.RateLimitServiceClient
}

// startProc starts bin with args and exactly env (nothing of the test's
// own environment), its output in a file of t's.
func startProc(t *testing.T, bin string, args []string, env map[string]string, p *envProc) {
	t.Helper()
	p.cmd = exec.Command(bin, args...)
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.log = filepath.Join(t.TempDir(), "log")
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.exited = make(chan struct{})
	go func() { p.err = p.cmd.Wait(); f.Close(); close(p.exited) }()
	t.Cleanup(func() { p.cmd.Process.Kill(); <-p.exited })
}

// outcome waits until p serves (its /healthcheck answers 200) or exits, or
// until deadline, and says which, with the last line of its log when it
// exits.
func (p *envProc) outcome(deadline time.Time) (class, detail string) {
	for {
		select {
		case <-p.exited:
			return "refuses", fmt.Sprintf("%v: %s", p.err, lastLine(p.log))
		default:
		}
		res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthcheck", p.http))
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return "serves", ""
			}
		}
		if time.Now().After(deadline) {
			return "neither serves nor exits", lastLine(p.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lastLine is the last line of a log that is not a goroutine trace's.
func lastLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var last string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, "\t") && !strings.HasPrefix(l, "goroutine ") && !strings.Contains(l, "(0x") && !strings.HasPrefix(l, "main.main") {
			last = l
		}
	}
	if len(last) > 200 {
		last = last[:200] + "..."
	}
	return last
}

// runEnvCase starts each deployment of c as the peer's process and as
// ours, and compares whether each serves, then the steps' answers.
func runEnvCase(t *testing.T, peerBin, oursBin string, c envCase) compatRow {
	r := compatRow{name: "env: " + c.name, legit: c.legit, kinds: map[string]bool{}}
	root := t.TempDir()
	for name, content := range c.files {
		testkit.WriteFile(t, filepath.Join(root, name), content)
	}
	deps := c.deps
	if len(deps) == 0 {
		deps = []map[string]string{{}}
	}
	prom := c.env["USE_PROMETHEUS"] == "true"
	var sides [2][]*envProc // the peer's, ours
	for s, bin := range []string{peerBin, oursBin} {
		args := []string{}
		if s == 1 {
			args = []string{"serve"}
		}
		srv := redistest.StartServer(t)
		for _, dep := range deps {
			p := &envProc{http: freePort(t), grpc: freePort(t), debug: freePort(t)}
			env := map[string]string{
				"PATH": os.Getenv("PATH"), "HOME": os.Getenv("HOME"),
				"HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1", "DEBUG_HOST": "127.0.0.1",
				"PORT": strconv.Itoa(p.http), "GRPC_PORT": strconv.Itoa(p.grpc), "DEBUG_PORT": strconv.Itoa(p.debug),
				"USE_STATSD": "false", "LOG_LEVEL": "warn", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr(),
				"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false",
			}
			if prom {
				p.pro = freePort(t)
				env["PROMETHEUS_ADDR"] = "127.0.0.1:" + strconv.Itoa(p.pro)
			}
			for _, m := range []map[string]string{c.env, dep} {
				for k, v := range m {
					env[k] = v
				}
			}
			startProc(t, bin, args, env, p)
			sides[s] = append(sides[s], p)
		}
	}
	wait := c.wait
	if wait == 0 {
		wait = 20 * time.Second
	}
	deadline := time.Now().Add(wait)
	serving := true
	for i := range deps {
		pc, pd := sides[0][i].outcome(deadline)
		oc, od := sides[1][i].outcome(deadline)
		if pc != "serves" || oc != "serves" {
			serving = false
		}
		if pc != oc {
			r.answers(fmt.Sprintf("deployment %d: ", i), []string{fmt.Sprintf("startup: the peer %s (%s); ours %s (%s)", pc, pd, oc, od)})
		}
	}
	if !serving {
		return r
	}
	for _, side := range sides {
		for _, p := range side {
			conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", p.grpc), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			p.client = rlsv3.NewRateLimitServiceClient(conn)
		}
	}
	clearOfMinuteEnd(50)
	for i, st := range c.steps {
		where := fmt.Sprintf("step %d: ", i+1)
		peer, ours := sides[0][st.dep], sides[1][st.dep]
		switch {
		case st.req != nil && st.at > 0:
			pn, on := admittedAtOnce(sides[0], st.req, st.at), admittedAtOnce(sides[1], st.req, st.at)
			if pn != st.admit || on != st.admit {
				t.Errorf("step %d, %d calls at once: the peer admitted %d, ours %d; the case expects %d", i+1, st.at, pn, on, st.admit)
			}
			if pn != on {
				r.answers(where, []string{fmt.Sprintf("%d calls at once: the peer admitted %d, ours %d", st.at, pn, on)})
			}
		case st.req != nil:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var p, o answer
			p.resp, p.err = peer.client.ShouldRateLimit(ctx, st.req)
			o.resp, o.err = ours.client.ShouldRateLimit(ctx, st.req)
			cancel()
			for side, a := range map[string]answer{"the peer": p, "ours": o} {
				if st.want >= 0 && (a.err != nil || a.resp.OverallCode != st.want) {
					t.Errorf("step %d: %s answered %v (%v); the case expects %v", i+1, side, a.resp.GetOverallCode(), a.err, st.want)
				}
			}
			ds, ks := compare(p, o)
			r.add(where, ds, ks)
		case st.get != "":
			pl, ol := getLines(t, peer.debug, st.get), getLines(t, ours.debug, st.get)
			r.answers(where, diffSets("GET "+st.get, pl, ol))
		case st.stats:
			ps, os := stableStats(t, peer.pro, ours.pro)
			if len(ps) == 0 || len(os) == 0 {
				t.Errorf("step %d: no statistics scraped: the peer %d series, ours %d", i+1, len(ps), len(os))
			}
			r.answers(where, diffStats(ps, os))
		}
	}
	return r
}

// admittedAtOnce sends r n times at once, spread over the processes in
// turn, and returns how many were answered OK.
func admittedAtOnce(procs []*envProc, r *rlsv3.RateLimitRequest, n int) int {
	var mu sync.Mutex
	var wg sync.WaitGroup
	ok := 0
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := procs[i%len(procs)].client.ShouldRateLimit(ctx, r)
			if err == nil && resp.OverallCode == rlsv3.RateLimitResponse_OK {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return ok
}

// getLines returns the lines of GET path on 127.0.0.1:port, sorted.
func getLines(t *testing.T, port int, path string) []string {
	t.Helper()
	_, b := testkit.Do(t, testkit.Request(t, "GET", fmt.Sprintf("http://127.0.0.1:%d%s", port, path), nil))
	var lines []string
	for l := range strings.SplitSeq(b, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	slices.Sort(lines)
	return lines
}

// answers records differences of the answer itself, each prefixed by where.
func (r *compatRow) answers(where string, diffs []string) {
	for _, x := range diffs {
		r.add(where, []string{"answer: " + x}, map[string]bool{"answer": true})
	}
}

// diffSets lists the lines only one side has.
func diffSets(what string, peer, ours []string) []string {
	var diffs []string
	for _, l := range peer {
		if !slices.Contains(ours, l) {
			diffs = append(diffs, fmt.Sprintf("%s: only the peer's: %s", what, l))
		}
	}
	for _, l := range ours {
		if !slices.Contains(peer, l) {
			diffs = append(diffs, fmt.Sprintf("%s: only ours: %s", what, l))
		}
	}
	return diffs
}

// emptyLabel is a label with an empty value, which Prometheus takes for
// the label's absence: the peer leaves out key2 where the service writes
// key2="".
var emptyLabel = regexp.MustCompile(`,?[a-zA-Z_][a-zA-Z0-9_]*=""`)

// scrapeStats returns the peer's statistics, ratelimit_service_*, of the
// Prometheus listener on port: series (labels with empty values left out)
// to value. The buckets and sum of response_time are left out, as durations
// differ; its count is kept.
func scrapeStats(t *testing.T, port int) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, l := range getLines(t, port, "/metrics") {
		if !strings.HasPrefix(l, "ratelimit_service_") || strings.HasPrefix(l, "ratelimit_service_response_time_seconds_bucket") ||
			strings.HasPrefix(l, "ratelimit_service_response_time_seconds_sum") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		series := emptyLabel.ReplaceAllString(l[:i], "")
		series = strings.TrimSuffix(strings.Replace(series, "{,", "{", 1), "{}")
		out[series] = l[i+1:]
	}
	return out
}

// stableStats scrapes both sides until neither changes over two scrapes
// (the statistics are flushed every STATS_FLUSH_INTERVAL), for at most 5 s.
func stableStats(t *testing.T, peerPort, oursPort int) (peer, ours map[string]string) {
	t.Helper()
	var lastP, lastO map[string]string
	for deadline := time.Now().Add(5 * time.Second); ; {
		time.Sleep(250 * time.Millisecond)
		peer, ours = scrapeStats(t, peerPort), scrapeStats(t, oursPort)
		if lastP != nil && fmt.Sprint(peer) == fmt.Sprint(lastP) && fmt.Sprint(ours) == fmt.Sprint(lastO) || time.Now().After(deadline) {
			return peer, ours
		}
		lastP, lastO = peer, ours
	}
}

// diffStats lists the series whose values differ, or that one side lacks.
func diffStats(peer, ours map[string]string) []string {
	var diffs []string
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range peer {
			if !yield(k) {
				return
			}
		}
		for k := range ours {
			if _, both := peer[k]; !both && !yield(k) {
				return
			}
		}
	})
	for _, name := range names {
		p, pok := peer[name]
		o, ook := ours[name]
		switch {
		case !pok:
			p = "none"
		case !ook:
			o = "none"
		}
		if p != o {
			diffs = append(diffs, fmt.Sprintf("statistic %s: the peer %s, ours %s", name, p, o))
		}
	}
	return diffs
}
