package operator

import (
	_ "embed" // the page's files
	"net/http"
	"strconv"
)

// The operator page: its HTML, style and script, served as they are, with
// no asset from elsewhere.
var (
	//go:embed web/index.html
	indexHTML []byte
	//go:embed web/page.css
	pageCSS []byte
	//go:embed web/page.js
	pageJS []byte
)

// pageFiles are the files of the operator page, by path.
var pageFiles = map[string]Asset{
	"/":         {indexHTML, "text/html; charset=utf-8"},
	"/page.css": {pageCSS, "text/css; charset=utf-8"},
	"/page.js":  {pageJS, "text/javascript; charset=utf-8"},
}

// pageCSP lets the page load only its own style and script, and fetch only
// from its own origin.
const pageCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Asset is a file of the operator page.
type Asset struct {
	body        []byte
	contentType string
}

// PageAsset returns the file of the operator page served at path: "/" (the
// HTML), "/page.css" or "/page.js"; false for any other path. The files
// hold no figure: the script reads them from GET v1/stats (a Report), with
// the token the user gives it when the service has one, so the page itself
// can be served to anyone, as a browser cannot send a bearer token on a
// navigation.
func PageAsset(path string) (Asset, bool) {
	a, ok := pageFiles[path]
	return a, ok
}

// Write answers 200 with the file, and headers that keep it from being
// framed, sniffed or cached without a check, and that let it load and
// fetch only from its own origin; with head, the body is left out.
func (a Asset) Write(w http.ResponseWriter, head bool) {
	h := w.Header()
	h.Set("Content-Type", a.contentType)
	h.Set("Content-Length", strconv.Itoa(len(a.body)))
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", pageCSP)
	h.Set("X-Frame-Options", "DENY")
	w.WriteHeader(http.StatusOK)
	if !head {
		w.Write(a.body) //nolint:errcheck // the client may be gone
	}
}
