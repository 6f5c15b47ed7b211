package server

import "github.com/prometheus/client_golang/prometheus"

// Register adds collectors to the registry that /metrics serves, for series
// of another part of the command (the Envoy gRPC service's). It fails when a
// collector's series clash with ones already registered.
func (m *Metrics) Register(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := m.registry.Register(c); err != nil {
			return err
		}
	}
	return nil
}
