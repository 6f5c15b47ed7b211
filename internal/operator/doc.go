// Package operator is the ratelimit service's operator page and the
// figures it shows: the page's HTML, style and script (PageAsset), the
// Stats the service keeps for it (a ratelimit.Observer and a fallback
// observer: decisions, their rate and latency per namespace and Envoy
// domain, outages, reloads, the most denied subjects) and the Report of
// GET /v1/stats, which the page's script reads. The page also looks a
// subject up (its plan and standings) with POST /v1/usage.
//
// The HTTP API (package server) serves the page and the report behind its
// own checks and token, and tells Report what only it knows, through a
// Source: the namespaces in force, the store and Envoy's domains. Nothing
// here serves HTTP on its own or starts a goroutine.
package operator
