package server

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
)

// AssignRequest is the body of POST /v1/assign; its fields' JSON names are
// those of fields.
type AssignRequest struct {
	// Namespace names a namespace of plans; empty means
	// config.DefaultNamespace.
	Namespace string
	// Subject is whose plan to set.
	Subject string
	// Plan is the plan to assign, one the namespace offers, or "" to
	// remove the assignment (the default plan applies). It is required.
	Plan *string
}

// fields are the body's fields: "namespace", "subject" and "plan".
func (r *AssignRequest) fields() []field {
	return []field{{"namespace", &r.Namespace}, {"subject", &r.Subject}, {"plan", &r.Plan}}
}

// Assigned is the answer of POST /v1/assign.
type Assigned struct {
	Namespace string `json:"namespace"`
	Subject   string `json:"subject"`
	// Plan is the plan assigned, "" when the assignment was removed.
	Plan string `json:"plan"`
	// Previous is the plan the assignment replaced: "" when the subject
	// had none, or had a policy of its own (which a Go program assigns).
	Previous string `json:"previous"`
}

// UsageRequest is the body of POST /v1/usage; its fields' JSON names are
// those of fields.
type UsageRequest struct {
	// Namespace names the namespace; empty means config.DefaultNamespace.
	Namespace string
	// Subject is whose usage to report.
	Subject string
}

// fields are the body's fields: "namespace" and "subject".
func (r *UsageRequest) fields() []field {
	return []field{{"namespace", &r.Namespace}, {"subject", &r.Subject}}
}

// assign is POST /v1/assign: set a subject's plan in a namespace of plans,
// for every process sharing the store (ratelimit.Plans.Assign). Every
// assignment accepted is logged at INFO, with the listener and the remote
// address it came through, the subject by its hash, and the old and new
// plan, and counted in ratelimit_plan_assignments_total.
func (s *Service) assign(w http.ResponseWriter, r *http.Request) {
	const path = "/v1/assign"
	var req AssignRequest
	if !s.request(w, r, path, &req.Subject, req.fields()...) {
		return
	}
	if req.Plan == nil {
		s.fail(w, path, http.StatusBadRequest, `plan is required: a plan the namespace offers, or "" to remove the assignment`)
		return
	}
	ns, set, ok := s.lookup(w, path, req.Namespace)
	if !ok {
		return
	}
	plans := set.plans[ns]
	if plans == nil {
		s.fail(w, path, http.StatusBadRequest, fmt.Sprintf("namespace %q offers no plans: assign in a namespace of plans", ns))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	old, err := plans.Assign(ctx, req.Subject, ratelimit.Assignment{Plan: *req.Plan})
	cancel()
	if err != nil {
		s.logFailure("assign", plans.Plan(set.limits[ns].DefaultPlan), req.Subject, err)
	}
	if s.failed(w, r, path, ns, err) {
		return
	}
	var listener string
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		listener = a.String()
	}
	s.log.Info("plan assigned", "namespace", ns, "subject", keyfmt.Hash(req.Subject), "plan", *req.Plan, "previous", old.Plan,
		"listener", listener, "remote", r.RemoteAddr)
	s.metrics.assignments.WithLabelValues(ns, *req.Plan).Inc()
	s.reply(w, path, http.StatusOK, Assigned{Namespace: ns, Subject: req.Subject, Plan: *req.Plan, Previous: old.Plan})
}

// usage is POST /v1/usage: a subject's plan, in a namespace of plans, and
// the standing of each limit and quota of its policy, without consuming
// (a peek under its plan), answered as /v1/peek answers but without the
// rate-limit headers.
func (s *Service) usage(w http.ResponseWriter, r *http.Request) {
	const path = "/v1/usage"
	var req UsageRequest
	if !s.request(w, r, path, &req.Subject, req.fields()...) {
		return
	}
	t, ok := s.target(w, path, req.Namespace, req.Subject, "")
	if !ok {
		return
	}
	d, err := s.check(r.Context(), opPeek, t.lim, req.Subject, 0)
	if s.failed(w, r, path, t.ns, err) {
		return
	}
	out := NewDecision(t.ns, req.Subject, 0, d, t.pol)
	out.Plan = t.plan
	s.reply(w, path, http.StatusOK, out)
}
