// Package openapi serves the OpenAPI 3.1 document of the service's HTTP API,
// docs/openapi.json, at GET /openapi.json. The document describes every
// endpoint of the API (package server), its bodies, statuses and headers;
// the tests of this package hold real answers of a running service to it.
//
// The document holds no secret: it is served to anyone, with or without the
// API's token.
package openapi

import (
	"net/http"
	"strconv"

	"github.com/exactlimit/ratelimit/docs"
)

// Path is where the service serves the document.
const Path = "/openapi.json"

// Handler returns the handler of GET (and HEAD) /openapi.json: the document
// as application/json. Any other method is 405 with a JSON error, as the
// API answers it.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			h.Set("Content-Type", "application/json")
			h.Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusMethodNotAllowed)
			w.Write([]byte(`{"error":"` + Path + ` wants GET"}` + "\n")) //nolint:errcheck // the client may be gone
			return
		}
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(docs.OpenAPI)))
		h.Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			w.Write([]byte(docs.OpenAPI)) //nolint:errcheck // the client may be gone
		}
	})
}
