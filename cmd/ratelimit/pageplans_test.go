package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// lookupResult is what the page shows of a subject it looked up.
type lookupResult struct {
	Plan, Table, Error, Note string
}

// lookUp fills the page's lookup form with ns and subject, submits it, and
// returns what it shows once the answer is in.
const lookUp = `(() => {
  const sel = document.getElementById("lookup-ns");
  if (!sel || ![...sel.options].some((o) => o.value === %q)) return null;
  if (!window.asked) {
    sel.value = %q;
    document.getElementById("lookup-subject").value = %q;
    document.getElementById("lookup-result").replaceChildren();
    document.getElementById("lookup-form").requestSubmit();
    window.asked = true;
    return null;
  }
  const out = document.getElementById("lookup-result");
  const text = (id) => { const e = document.getElementById(id); return e ? e.textContent : ""; };
  if (!out.querySelector("table, .error")) return null;
  window.asked = false;
  return {Plan: text("lookup-plan"), Table: text("lookup-table"), Error: text("lookup-error"), Note: out.querySelector("p").textContent};
})()`

// TestOperatorPageLooksUpPlans opens the operator page of 'ratelimit serve'
// over Redis, with a token, in headless Chromium (real time, over
// DevTools), and looks subjects up as a person does: a subject assigned
// pro through POST /v1/assign shows pro and its standing under pro, one
// without an assignment the default plan, one of a namespace without plans
// its own limit; and the namespace's card lists its plans.
func TestOperatorPageLooksUpPlans(t *testing.T) {
	needBrowser(t)
	t.Parallel()
	srv := redistest.StartServer(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ratelimit.yaml")
	os.WriteFile(cfg, []byte(testkit.Plans+`namespaces:
  - name: default
    rate_limit: {unit: minute, requests_per_unit: 10}
  - name: api
    plans: [free, pro]
    default_plan: free
`), 0o644)
	const token = "pl4ns-t0ken"
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
	p := serve(t, nil, "--redis", "redis://"+srv.Addr(), "--config", cfg, "--token-file", tokenFile)
	auth := []string{"Authorization", "Bearer " + token}
	if r := post(t, p.addr, "/v1/assign", `{"namespace":"api","subject":"acme","plan":"pro"}`, auth...); r.code != 200 {
		t.Fatalf("assign: %d %s", r.code, r.raw)
	}
	if r := post(t, p.addr, "/v1/acquire", `{"namespace":"api","subject":"acme"}`, auth...); r.code != 200 || r.body["plan"] != "pro" {
		t.Fatalf("acquire: %d %s", r.code, r.raw)
	}

	d := openDevtools(t, "http://"+p.addr+"/#token="+token, "--window-size=1200,900")
	look := func(ns, subject string) lookupResult {
		t.Helper()
		var r lookupResult
		d.poll(fmt.Sprintf(lookUp, ns, ns, subject), &r)
		return r
	}
	// (Pro's bucket refills a token every 1.2 s of real time; the day's
	// quota does not.)
	if r := look("api", "acme"); r.Plan != "pro" || !regexp.MustCompile(`Rate limit(49|50) of 50`).MatchString(r.Table) || !strings.Contains(r.Table, "Quota (a day in UTC, of requests)999 of 1,000") {
		t.Errorf("acme in api: %+v, want pro, 49 or 50 of 50 and 999 of 1,000 left", r)
	}
	if r := look("api", "globex"); r.Plan != "free" || !strings.Contains(r.Table, "Rate limit3 of 3") {
		t.Errorf("globex in api: %+v, want free, 3 of 3 left", r)
	}
	if r := look("default", "acme"); r.Plan != "" || !strings.Contains(r.Note, "offers no plans") || !strings.Contains(r.Table, "Rate limit10 of 10") {
		t.Errorf("acme in default: %+v, want no plan and 10 of 10 left", r)
	}
	var policy string
	d.poll(`(() => { const e = document.querySelector('[data-ns="api"] [data-field="policy"]'); return e && e.textContent || null; })()`, &policy)
	if want := "Plans free (3 per 1m, burst 3), pro (50 per 1m, burst 50); default free"; policy != want {
		t.Errorf("api's card: %q, want %q", policy, want)
	}
	// Nothing was taken by the lookups: the day's quota still counts the
	// one acquire.
	r := post(t, p.addr, "/v1/usage", `{"namespace":"api","subject":"acme"}`, auth...)
	if limits, _ := r.body["limits"].([]any); len(limits) != 2 || limits[1].(map[string]any)["remaining"] != float64(999) {
		t.Errorf("after the lookups: %s", r.raw)
	}
	p.stop(t)
}
