package doctest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/internal/cli"
	"github.com/exactlimit/ratelimit/internal/service"
)

// startServe runs 'ratelimit serve' in this process on a free loopback
// port, as the sessions start it (the embedded store; without args, the
// default namespace), with args added, and returns its address, which the
// running service gives (cli.Env.ServeStarted). It stops when the test
// ends.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	env := cli.Env{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(string) string { return "" },
		ServeStarted: func(s *service.Service) { addr <- s.Addrs().HTTP.String() }}
	done := make(chan int, 1)
	go func() { done <- cli.Main(ctx, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...), env) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("serve did not stop within 10 s of its context ending")
		}
	})
	select {
	case a := <-addr:
		return a
	case code := <-done:
		t.Fatalf("serve exited %d before serving", code)
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not start within 10 s")
	}
	return ""
}

// step is one "$ curl ..." line of a session and the output printed after it.
type step struct {
	line    int // in the markdown file
	command string
	output  []string
}

// firstSession returns the steps of the file's first fenced block whose
// first line is a curl command: the session a reader tries first.
func firstSession(t *testing.T, file string) []step {
	t.Helper()
	bs, err := blocks(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		lines := strings.Split(b.text, "\n")
		if b.lang != "" || !strings.HasPrefix(lines[0], "$ curl ") {
			continue
		}
		var steps []step
		for i, l := range lines {
			if cmd, ok := strings.CutPrefix(l, "$ "); ok {
				steps = append(steps, step{line: b.line + i, command: cmd})
			} else {
				steps[len(steps)-1].output = append(steps[len(steps)-1].output, l)
			}
		}
		return steps
	}
	t.Fatalf("%s has no session of curl commands", file)
	return nil
}

// words splits a shell command line into words, with '...' and "..."
// quoting (no escapes, no variables: the sessions use neither).
func words(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		case '\'', '"':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("unclosed %c", c)
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

// curl is what a session's curl command asks for: the options the sessions
// use, and no other.
type curl struct {
	method, url, data, format string
	headers                   http.Header
	include, discardBody      bool
	grep                      *regexp.Regexp // "| grep [-E] RE" after the command
	echo                      bool           // "; echo" after the command
}

// parseCurl reads one session command. Anything it does not know is an
// error, so that a session the test cannot run fails instead of passing.
func parseCurl(command string) (curl, error) {
	c := curl{headers: http.Header{}}
	if rest, ok := strings.CutSuffix(command, "; echo"); ok {
		command, c.echo = rest, true
	}
	if before, pattern, ok := strings.Cut(command, " | grep "); ok {
		ws, err := words(pattern)
		if err != nil {
			return c, err
		}
		if len(ws) == 2 && ws[0] == "-E" {
			ws = ws[1:]
		}
		if len(ws) != 1 {
			return c, fmt.Errorf("grep %q: want one pattern", pattern)
		}
		re, err := regexp.Compile(ws[0])
		if err != nil {
			return c, err
		}
		command, c.grep = before, re
	}
	ws, err := words(command)
	if err != nil {
		return c, err
	}
	if len(ws) == 0 || ws[0] != "curl" {
		return c, fmt.Errorf("not a curl command")
	}
	for i := 1; i < len(ws); i++ {
		opt, v := ws[i], "" // v: the value of an option that takes one
		switch opt {
		case "-X", "-H", "-d", "-o", "-w":
			if i+1 >= len(ws) {
				return c, fmt.Errorf("%s needs a value", opt)
			}
			i++
			v = ws[i]
		}
		switch opt {
		case "-s":
		case "-si", "-is", "-i":
			c.include = true
		case "-X":
			c.method = v
		case "-H":
			name, value, ok := strings.Cut(v, ":")
			if !ok {
				return c, fmt.Errorf("-H %q: no colon", v)
			}
			c.headers.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		case "-d":
			c.data = v
		case "-o":
			if v != "/dev/null" {
				return c, fmt.Errorf("-o %s: only /dev/null", v)
			}
			c.discardBody = true
		case "-w":
			c.format = v
			if strings.ReplaceAll(c.format, "%{http_code}", "") != " " {
				return c, fmt.Errorf("-w %q: only \"%%{http_code} \"", c.format)
			}
		default:
			if strings.HasPrefix(opt, "-") || c.url != "" {
				return c, fmt.Errorf("curl option %q is not known to the test", opt)
			}
			c.url = opt
		}
	}
	if c.url == "" {
		return c, fmt.Errorf("no URL")
	}
	if c.method == "" {
		c.method = http.MethodGet
		if c.data != "" {
			c.method = http.MethodPost
		}
	}
	return c, nil
}

// urls expands curl's one numeric range glob ("?try=[1-12]"), pointing the
// session's localhost:8080 at addr.
func (c curl) urls(addr string) ([]string, error) {
	u := strings.Replace(c.url, "localhost:8080", addr, 1)
	if !strings.HasPrefix(u, "http") {
		u = "http://" + u
	}
	m := regexp.MustCompile(`\[(\d+)-(\d+)\]`).FindStringSubmatchIndex(u)
	if m == nil {
		return []string{u}, nil
	}
	from, _ := strconv.Atoi(u[m[2]:m[3]])
	to, _ := strconv.Atoi(u[m[4]:m[5]])
	if from > to || to-from > 1000 {
		return nil, fmt.Errorf("range [%d-%d]", from, to)
	}
	var out []string
	for n := from; n <= to; n++ {
		out = append(out, u[:m[0]]+strconv.Itoa(n)+u[m[1]:])
	}
	return out, nil
}

// varies are the parts of an answer that depend on the wall clock or its
// length: headers whose value is not compared (only their presence), and
// the JSON fields compared by sign only.
var (
	variesHeader = map[string]bool{"Date": true, "X-Ratelimit-Reset": true, "Content-Length": true}
	variesField  = regexp.MustCompile(`_ms$`)
)

// sameJSON compares a JSON answer with the one printed: equal (arrays item
// by item), except the *_ms fields, which must be 0 where the session shows 0 and between 1 and
// 1000 (the sessions' namespace refills in one second, so no wait is
// longer) where it shows more.
func sameJSON(got, want any, path string) error {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok || len(g) != len(w) {
			return fmt.Errorf("%s: got %v, want %v", path, got, want)
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok {
				return fmt.Errorf("%s.%s missing", path, k)
			}
			if variesField.MatchString(k) {
				wn, _ := wv.(float64)
				gn, ok := gv.(float64)
				if !ok || (wn == 0) != (gn == 0) || gn < 0 || gn > 1000 {
					return fmt.Errorf("%s.%s = %v, want %v (0 as shown, or between 1 and 1000)", path, k, gv, wv)
				}
				continue
			}
			if err := sameJSON(gv, wv, path+"."+k); err != nil {
				return err
			}
		}
		return nil
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Errorf("%s: got %v, want %v", path, got, want)
		}
		for i := range w {
			if err := sameJSON(g[i], w[i], fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	default:
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("%s = %v, want %v", path, got, want)
		}
		return nil
	}
}

// checkBody compares a body with the printed one: as JSON when the printed
// one is JSON, else line by line.
func checkBody(got string, want []string) error {
	w := strings.Join(want, "\n")
	var wj any
	if json.Unmarshal([]byte(w), &wj) == nil {
		var gj any
		if err := json.Unmarshal([]byte(got), &gj); err != nil {
			return fmt.Errorf("body %q is not JSON: %v", got, err)
		}
		return sameJSON(gj, wj, "body")
	}
	if strings.TrimRight(got, "\n") != w {
		return fmt.Errorf("body:\n%s\nwant:\n%s", got, w)
	}
	return nil
}

// run sends the step's requests to addr and compares the answers with the
// step's output.
func (s step) run(addr string) error {
	c, err := parseCurl(s.command)
	if err != nil {
		return err
	}
	urls, err := c.urls(addr)
	if err != nil {
		return err
	}
	var codes []string
	var lastRes *http.Response
	var lastBody string
	for _, u := range urls {
		req, err := http.NewRequest(c.method, u, strings.NewReader(c.data))
		if err != nil {
			return err
		}
		req.Header = c.headers.Clone()
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			return err
		}
		codes = append(codes, strconv.Itoa(res.StatusCode))
		lastRes, lastBody = res, string(body)
	}
	switch {
	case c.format != "":
		got := strings.Join(codes, " ")
		if len(s.output) != 1 || strings.TrimSpace(s.output[0]) != got {
			return fmt.Errorf("status codes %q, want %q", got, s.output)
		}
		return nil
	case c.grep != nil:
		var got []string
		sc := bufio.NewScanner(strings.NewReader(lastBody))
		for sc.Scan() {
			if c.grep.MatchString(sc.Text()) {
				got = append(got, sc.Text())
			}
		}
		if !reflect.DeepEqual(got, s.output) {
			return fmt.Errorf("grep gave:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(s.output, "\n"))
		}
		return nil
	case c.include:
		return checkIncluded(lastRes, lastBody, s.output)
	}
	if lastRes.StatusCode != http.StatusOK && lastRes.StatusCode != http.StatusTooManyRequests && len(s.output) == 0 {
		return fmt.Errorf("status %d and no output shown", lastRes.StatusCode)
	}
	return checkBody(lastBody, s.output)
}

// checkIncluded compares a response with curl -i's printed status line,
// headers and body.
func checkIncluded(res *http.Response, body string, out []string) error {
	if len(out) == 0 {
		return fmt.Errorf("no output shown")
	}
	if got := res.Proto + " " + res.Status; got != out[0] {
		return fmt.Errorf("status line %q, want %q", got, out[0])
	}
	i := 1
	shown := map[string]bool{}
	for ; i < len(out) && out[i] != ""; i++ {
		name, value, ok := strings.Cut(out[i], ": ")
		if !ok {
			return fmt.Errorf("header line %q", out[i])
		}
		name = http.CanonicalHeaderKey(name)
		shown[name] = true
		got, present := res.Header[name]
		if !present {
			return fmt.Errorf("header %s missing", name)
		}
		if !variesHeader[name] && (len(got) != 1 || got[0] != value) {
			return fmt.Errorf("header %s: %q, want %q", name, got, value)
		}
	}
	for name := range res.Header {
		if !shown[name] {
			return fmt.Errorf("header %s is sent but not shown", name)
		}
	}
	if i >= len(out) {
		return fmt.Errorf("no body shown")
	}
	return checkBody(body, out[i+1:])
}

// TestServiceSessions runs the first curl session of README.md and of
// docs/service.md against 'ratelimit serve' started as they start it, and
// checks each answer against the one printed: status codes, headers, and
// the JSON bodies (the waits, which depend on the wall clock, by sign and
// bound only). The session's requests follow each other as fast as the
// loopback allows: a burst of 13 within the 100 ms in which one token
// refills.
func TestServiceSessions(t *testing.T) {
	for _, file := range []string{"README.md", "docs/service.md"} {
		t.Run(file, func(t *testing.T) {
			steps := firstSession(t, file)
			addr := startServe(t)
			for _, s := range steps {
				if err := s.run(addr); err != nil {
					t.Fatalf("%s:%d: %s\n%v", file, s.line, s.command, err)
				}
			}
			t.Logf("%s: %d commands answered as shown", file, len(steps))
		})
	}
}

// TestParseCurlRefusesWhatItDoesNotKnow: a session using a curl option the
// test does not implement fails, rather than being run half.
func TestParseCurlRefusesWhatItDoesNotKnow(t *testing.T) {
	for _, cmd := range []string{
		"curl -s --compressed localhost:8080/",
		"curl -s -o out.json localhost:8080/",
		`curl -s -w "%{time_total}" localhost:8080/`,
		"curl -s -X POST",
		"wget localhost:8080/",
		"curl -s 'localhost:8080/",
	} {
		if _, err := parseCurl(cmd); err == nil {
			t.Errorf("parseCurl(%q) accepted it", cmd)
		}
	}
	c, err := parseCurl(`curl -s -o /dev/null -w "%{http_code} " -X POST -H 'Content-Type: application/json' -d '{"subject": "alice"}' "localhost:8080/v1/acquire?try=[1-3]"; echo`)
	if err != nil {
		t.Fatal(err)
	}
	urls, err := c.urls("127.0.0.1:1")
	want := []string{"http://127.0.0.1:1/v1/acquire?try=1", "http://127.0.0.1:1/v1/acquire?try=2", "http://127.0.0.1:1/v1/acquire?try=3"}
	if err != nil || !reflect.DeepEqual(urls, want) || c.method != "POST" || c.headers.Get("Content-Type") != "application/json" || c.data != `{"subject": "alice"}` || !c.echo {
		t.Fatalf("parsed %+v, urls %v, %v", c, urls, err)
	}
}
