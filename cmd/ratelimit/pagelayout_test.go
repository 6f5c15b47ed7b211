package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// devtools is a headless Chromium driven over its DevTools pipe
// (--remote-debugging-pipe: it reads commands on fd 3 and writes answers on
// fd 4, each a JSON object ended by a NUL). Unlike chromium's
// --virtual-time-budget, the page runs in real time, as a person sees it.
type devtools struct {
	t       *testing.T
	w       *os.File
	r       *bufio.Reader
	id      int
	session string
}

// openDevtools starts Chromium with a page at url, args added, and
// attaches to it. Chromium is killed when the test ends.
func openDevtools(t *testing.T, url string, args ...string) *devtools {
	t.Helper()
	needBrowser(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	toChrome, cmdW, err := os.Pipe() // chrome reads fd 3
	if err != nil {
		t.Fatal(err)
	}
	answersR, fromChrome, err := os.Pipe() // chrome writes fd 4
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir(), "--remote-debugging-pipe"}
	cmd := exec.CommandContext(ctx, chromiumPath, append(append(base, args...), "about:blank")...)
	cmd.ExtraFiles = []*os.File{toChrome, fromChrome}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Chromium holds its ends; ours close so that its exit ends our reads.
	toChrome.Close()
	fromChrome.Close()
	t.Cleanup(func() {
		cmdW.Close()
		cancel()
		cmd.Wait() //nolint:errcheck // killed
		answersR.Close()
	})
	d := &devtools{t: t, w: cmdW, r: bufio.NewReader(answersR)}
	var target struct{ TargetID string }
	d.call("Target.createTarget", map[string]any{"url": url}, &target)
	var attached struct{ SessionID string }
	d.call("Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached)
	d.session = attached.SessionID
	return d
}

// call sends one command (to the page once attached) and decodes its
// result into out, skipping the events that come before it.
func (d *devtools) call(method string, params, out any) {
	d.t.Helper()
	d.id++
	msg := map[string]any{"id": d.id, "method": method, "params": params}
	if d.session != "" {
		msg["sessionId"] = d.session
	}
	b, err := json.Marshal(msg)
	if err != nil {
		d.t.Fatal(err)
	}
	if _, err := d.w.Write(append(b, 0)); err != nil {
		d.t.Fatalf("%s: %v", method, err)
	}
	for {
		line, err := d.r.ReadBytes(0)
		if err != nil {
			d.t.Fatalf("%s: chromium's pipe: %v", method, err)
		}
		var ans struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *struct{ Message string }
		}
		if err := json.Unmarshal(bytes.TrimSuffix(line, []byte{0}), &ans); err != nil {
			d.t.Fatalf("%s: %v in %q", method, err, line)
		}
		if ans.ID != d.id {
			continue // an event
		}
		if ans.Error != nil {
			d.t.Fatalf("%s: %s", method, ans.Error.Message)
		}
		if out != nil {
			if err := json.Unmarshal(ans.Result, out); err != nil {
				d.t.Fatalf("%s: %v in %s", method, err, ans.Result)
			}
		}
		return
	}
}

// poll evaluates expr in the page every 20 ms until it returns something
// other than null, and decodes that into out; it fails the test after 10 s.
func (d *devtools) poll(expr string, out any) {
	d.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var res struct {
			Result struct {
				Value json.RawMessage `json:"value"`
			} `json:"result"`
			ExceptionDetails *struct{ Text string } `json:"exceptionDetails"`
		}
		d.call("Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true}, &res)
		if res.ExceptionDetails != nil {
			d.t.Fatalf("%s: %s", expr, res.ExceptionDetails.Text)
		}
		if v := res.Result.Value; len(v) > 0 && string(v) != "null" {
			if err := json.Unmarshal(v, out); err != nil {
				d.t.Fatal(err)
			}
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("after 10 s, still null: %s", expr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// chartShape is how the first namespace's chart is drawn on the screen.
type chartShape struct {
	Width      float64 // the chart's width on the screen, in CSS pixels
	DrawnFor   float64 // its viewBox's width: the width it was drawn for
	AxisHeight float64 // the y axis on the screen (86 units of the viewBox)
	LabelSize  float64 // a label's height on the screen (10 px text)
}

// firstChart measures the first chart once it and every namespace's chart
// are drawn (null before); with want, once it is drawn for that width.
const firstChart = `(() => {
  const charts = document.querySelectorAll("svg.chart");
  if (charts.length < %d || [...charts].some((c) => !c.querySelector("polyline"))) return null;
  const c = charts[0];
  const axes = c.querySelectorAll("line.axis");
  const shape = {Width: c.getBoundingClientRect().width, DrawnFor: c.viewBox.baseVal.width,
    AxisHeight: axes[1].getBoundingClientRect().height,
    LabelSize: c.querySelector("text.label").getBoundingClientRect().height};
  return %s ? shape : null;
})()`

// TestPageChartsSizedAfterLayout opens the operator page with two
// namespaces in real time (no virtual-time budget) and measures the first
// chart as soon as the charts are drawn: it is drawn for its own width, so
// its axis and labels keep their size, not for the whole row it had
// before the second card came (which left it flattened, its labels half
// size, until the next refresh). Then the window narrows and the chart is
// drawn again for its new width.
func TestPageChartsSizedAfterLayout(t *testing.T) {
	needBrowser(t)
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ratelimit.yaml")
	os.WriteFile(cfg, []byte("namespaces:\n  - name: default\n    rate_limit: {unit: second, requests_per_unit: 10}\n"+
		"  - name: login\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"), 0o644)
	p := serve(t, nil, "--config", cfg)
	for range 12 {
		post(t, p.addr, "/v1/acquire", `{"subject":"alice"}`)
	}
	d := openDevtools(t, "http://"+p.addr+"/", "--window-size=1200,900")
	sane := func(when string, s chartShape) {
		t.Helper()
		if s.Width < 100 || s.DrawnFor < s.Width-2 || s.DrawnFor > s.Width+2 || s.AxisHeight < 80 || s.LabelSize < 9 {
			t.Errorf("%s: the first chart is %.0f px wide, drawn for %.0f, its axis %.1f px high (want 86), its labels %.1f px (want 10 or more)",
				when, s.Width, s.DrawnFor, s.AxisHeight, s.LabelSize)
		}
	}
	var first chartShape
	d.poll(fmt.Sprintf(firstChart, 2, "true"), &first)
	sane("first drawn", first)

	d.call("Emulation.setDeviceMetricsOverride", map[string]any{"width": 480, "height": 900, "deviceScaleFactor": 1, "mobile": false}, nil)
	var narrow chartShape
	d.poll(fmt.Sprintf(firstChart, 2, "Math.abs(shape.DrawnFor - shape.Width) <= 2 && shape.Width < 480"), &narrow)
	sane("at 480 px", narrow)
	if narrow.Width >= first.Width {
		t.Errorf("the chart did not narrow with the window: %.0f then %.0f px", first.Width, narrow.Width)
	}
	p.stop(t)
}

// TestPageBadFragment opens the page with a token fragment that does not
// decode (#token=%E0%A4%A): the page must not stop at "Loading" on an
// uncaught URIError, but show the token form, saying why, and remove the
// fragment from the address.
func TestPageBadFragment(t *testing.T) {
	needBrowser(t)
	t.Parallel()
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte("fr4gment-t0ken\n"), 0o600)
	p := serve(t, nil, "--token-file", tokenFile)
	for _, frag := range []string{"#token=%E0%A4%A", "#token=%", "#x=1&token=%ZZ"} {
		pg := openPage(t, "http://"+p.addr+"/"+frag)
		if !strings.Contains(string(pg), `<form id="token-form" class="card">`) {
			t.Errorf("%s: the token form is not shown:\n%s", frag, pg)
		}
		if s := pg.text(t, "status"); !strings.Contains(s, "wants its API token") {
			t.Errorf("%s: status %q", frag, s)
		}
		if s := pg.text(t, "token-error"); !strings.Contains(s, "not validly encoded") {
			t.Errorf("%s: the form does not say why: %q", frag, s)
		}
	}
	// In real time too, and the address loses the fragment.
	d := openDevtools(t, "http://"+p.addr+"/#token=%E0%A4%A")
	var hash string
	d.poll(`(() => { const f = document.getElementById("token-form"); return f && !f.hidden ? location.hash || "none" : null; })()`, &hash)
	if hash != "none" {
		t.Errorf("the address keeps the fragment %q", hash)
	}
	p.stop(t)
}
