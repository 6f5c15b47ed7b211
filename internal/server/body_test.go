package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// post sends body to the real server at base+path with the given
// Content-Type and headers (a "Host" sets the request's Host), and returns
// the status and body.
func post(t *testing.T, base, path, contentType, body string, hdr ...string) (int, string) {
	t.Helper()
	req := testkit.Request(t, "POST", base+path, strings.NewReader(body), hdr...)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, b := testkit.Do(t, req)
	return res.StatusCode, b
}

func TestInvalidUTF8SubjectsDoNotShareABucket(t *testing.T) {
	s, _, _ := newService(t, Options{Policies: config.Policies{"default": {Requests: ratelimit.PerMinute(1)}}})
	base := testkit.Serve(t, s.Handler())
	for _, body := range []string{
		"{\"subject\":\"\xff\"}", "{\"subject\":\"\xfe\"}",
		`{"subject":"\ud800"}`, `{"subject":"\udbff"}`,
		"{\"subject\":\"a\",\"namespace\":\"\xff\"}",
	} {
		if code, msg := post(t, base, "/v1/acquire", "application/json", body); code != 400 {
			t.Errorf("body %q: %d %s, want 400", body, code, msg)
		}
	}
	// Valid UTF-8 subjects that differ keep their own buckets.
	for _, subj := range []string{"é", "è"} {
		if code, msg := post(t, base, "/v1/acquire", "application/json", `{"subject":"`+subj+`"}`); code != 200 {
			t.Errorf("subject %q: %d %s", subj, code, msg)
		}
	}
}

func TestPostNeedsJSONContentType(t *testing.T) {
	s, _, _ := newService(t, Options{})
	base := testkit.Serve(t, s.Handler())
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx"} {
		for _, path := range []string{"/v1/reset", "/v1/acquire", "/v1/peek"} {
			if code, msg := post(t, base, path, ct, `{"subject":"a"}`); code != 415 {
				t.Errorf("%s with Content-Type %q: %d %s, want 415", path, ct, code, msg)
			}
		}
	}
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON"} {
		if code, msg := post(t, base, "/v1/reset", ct, `{"subject":"a"}`); code != 200 {
			t.Errorf("Content-Type %q: %d %s", ct, code, msg)
		}
	}
}

func TestStrictJSONFields(t *testing.T) {
	s, _, _ := newService(t, Options{Policies: config.Policies{"default": {Requests: ratelimit.PerSecond(10)}, "login": {Requests: ratelimit.PerMinute(5)}}})
	base := testkit.Serve(t, s.Handler())
	for _, tt := range []struct{ path, body, msg string }{
		{"/v1/acquire", `{"Subject":"a"}`, `unknown field "Subject"`},
		{"/v1/acquire", `{"SUBJECT":"a"}`, `unknown field "SUBJECT"`},
		{"/v1/acquire", `{"subject":"a","subject":"b"}`, `field "subject" appears twice`},
		{"/v1/acquire", `{"subject":"a","cost":1,"cost":2}`, `field "cost" appears twice`},
		// A name is checked before any value, wherever it stands.
		{"/v1/acquire", `{"subject":1,"weight":2}`, `unknown field "weight"`},
		{"/v1/acquire", `{"cost":"2","subject":"a","subject":"b"}`, `field "subject" appears twice`},
		// A malformed body is told as malformed before a value of the wrong type.
		{"/v1/acquire", `{"subject":1,"cost":2]`, "malformed JSON at byte 22"},
		// One rule for cost: 1 up to the capacity, whatever the operation.
		{"/v1/peek", `{"subject":"a","cost":0}`, "cost must be at least 1"},
		{"/v1/peek", `{"subject":"a","cost":6,"namespace":"login"}`, "exceeds the capacity 5"},
		{"/v1/reset", `{"subject":"a","cost":6,"namespace":"login"}`, "exceeds the capacity 5"},
	} {
		if code, msg := post(t, base, tt.path, "application/json", tt.body); code != 400 || !strings.Contains(msg, strings.ReplaceAll(tt.msg, `"`, `\"`)) {
			t.Errorf("%s %s: %d %s, want 400 with %q", tt.path, tt.body, code, msg, tt.msg)
		}
	}
}

// TestBodyDecodedOnce: every POST of the API reads and decodes its body in
// one call of decodeBody, whatever the answer (s.decodes counts the calls),
// and reads the request's body once, to its end.
func TestBodyDecodedOnce(t *testing.T) {
	s, _, _ := newService(t, Options{Policies: config.Policies{
		"default": {Requests: ratelimit.PerSecond(10)},
		"chat":    {Requests: ratelimit.PerMinute(60), Tokens: ratelimit.Limit{Capacity: 90000, RefillTokens: 90000, RefillPeriod: time.Minute}},
	}})
	h := s.Handler()
	for _, tc := range []struct{ path, body string }{
		{"/v1/acquire", `{"subject":"alice","cost":2}`},
		{"/v1/acquire", `{"namespace":"chat","subject":"acme"}`},
		{"/v1/acquire", `{"subject":"alice","cost":0}`},
		{"/v1/acquire", `{"subject":"a","cost":1.5}`},
		{"/v1/acquire", `{"subject" "a"}`},
		{"/v1/acquire", `{"namespace":"nope","subject":"a"}`},
		{"/v1/peek", `{"subject":"alice"}`},
		{"/v1/reset", `{"subject":"alice"}`},
		{"/v1/reserve", `{"namespace":"chat","subject":"acme","cost":[1,500]}`},
		{"/v1/settle", `{"namespace":"chat","token":"x","used":[1,480]}`},
	} {
		body := &countingReader{r: strings.NewReader(tc.body)}
		r := httptest.NewRequest(http.MethodPost, tc.path, body)
		r.Header.Set("Content-Type", "application/json")
		before := s.decodes.Load()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if got := s.decodes.Load() - before; got != 1 {
			t.Errorf("%s %s (%d): the body decoded %d times, want once", tc.path, tc.body, w.Code, got)
		}
		if body.bytes != len(tc.body) || body.eofs != 1 {
			t.Errorf("%s %s: %d bytes read of %d, the end reached %d times, want once", tc.path, tc.body, body.bytes, len(tc.body), body.eofs)
		}
	}
}

// countingReader counts the bytes read through it and the reads that
// found its end.
type countingReader struct {
	r           io.Reader
	bytes, eofs int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.bytes += n
	if err == io.EOF {
		c.eofs++
	}
	return n, err
}
