package service

import (
	"expvar"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// debugEndpoints are the debug listener's paths with what they serve, as the
// peer lists them at its root.
var debugEndpoints = [][2]string{
	{"/debug/pprof/", "root of various pprof endpoints. hit for help."},
	{"/debug/pprof/profile", "CPU profiling endpoint"},
	{"/debug/pprof/trace", "trace endpoint"},
	{"/rlconfig", "print out the currently loaded configuration for debugging"},
	{"/stats", "print out stats"},
}

// debugHandler serves the peer's debug endpoints (its DEBUG_HOST:DEBUG_PORT):
// the list of them at /, pprof under /debug/pprof/, the Envoy configuration
// in force at /rlconfig (empty without the Envoy service), and at /stats the
// Envoy service's counters and gauges, one "name{labels}: value" a line,
// then the process's expvar variables, as the peer prints them.
func (s *Service) debugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/rlconfig", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if s.envoy != nil {
			io.WriteString(w, s.envoy.svc.Config().Dump()) //nolint:errcheck // the client went away
		}
	})
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if s.envoy != nil {
			writeStats(w, s.envoy.stats)
		}
		expvar.Do(func(kv expvar.KeyValue) { fmt.Fprintf(w, "%s: %s\n", kv.Key, kv.Value) })
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		for _, e := range debugEndpoints {
			fmt.Fprintf(w, "%s: %s\n", e[0], e[1])
		}
	})
	return mux
}

// writeStats writes the counters and gauges of g, one "name{labels}: value"
// a line, sorted.
func writeStats(w io.Writer, g prometheus.Gatherer) {
	families, err := g.Gather()
	if err != nil {
		fmt.Fprintf(w, "# %v\n", err)
	}
	var lines []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var v float64
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			default:
				continue
			}
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := f.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			lines = append(lines, fmt.Sprintf("%s: %v\n", name, v))
		}
	}
	slices.Sort(lines)
	io.WriteString(w, strings.Join(lines, "")) //nolint:errcheck // the client went away
}
