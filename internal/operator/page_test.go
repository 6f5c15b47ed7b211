package operator

import (
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"
)

// TestPageIsSelfContained holds the page to its own origin: no script,
// style, font or image from elsewhere, so that it works offline and leaks
// nothing to a third party.
func TestPageIsSelfContained(t *testing.T) {
	url := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	for path, f := range pageFiles {
		if len(f.body) == 0 {
			t.Errorf("%s is empty", path)
		}
		for _, m := range url.FindAllString(string(f.body), -1) {
			if m != "http://www.w3.org" { // the SVG namespace, a name, not a fetch
				t.Errorf("%s refers to %s", path, m)
			}
		}
	}
}

// TestAssetWrite: a file of the page goes with its length, its type and
// headers that keep it to its own origin; HEAD gets no body.
func TestAssetWrite(t *testing.T) {
	a, ok := PageAsset("/page.js")
	if !ok {
		t.Fatal("no /page.js")
	}
	if _, ok := PageAsset("/index.html"); ok {
		t.Error("/index.html is served: the page is at /")
	}
	for _, head := range []bool{false, true} {
		w := httptest.NewRecorder()
		a.Write(w, head)
		h := w.Result().Header
		if w.Code != 200 || h.Get("Content-Type") != "text/javascript; charset=utf-8" || h.Get("Content-Length") != strconv.Itoa(len(a.body)) ||
			h.Get("Content-Security-Policy") != pageCSP || h.Get("X-Frame-Options") != "DENY" {
			t.Errorf("head %v: %d %v", head, w.Code, h)
		}
		want := len(a.body)
		if head {
			want = 0
		}
		if w.Body.Len() != want {
			t.Errorf("head %v: a body of %d bytes, want %d", head, w.Body.Len(), want)
		}
	}
}
