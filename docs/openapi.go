// Package docs holds the OpenAPI 3.1 document of the HTTP API of
// ratelimit serve, docs/openapi.json, embedded so that the service serves
// the very file kept here (GET /openapi.json, package internal/openapi).
// It has no other code.
package docs

import _ "embed"

// OpenAPI is docs/openapi.json.
//
//go:embed openapi.json
var OpenAPI string
