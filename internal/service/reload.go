package service

import (
	"context"
	"crypto/sha256"
	"time"

	"github.com/exactlimit/ratelimit/internal/filewatch"
)

// A reloader reads one file of the service again and puts it in force; on
// an error it logs why and keeps what is in force (the Prometheus pattern:
// one list, applied in turn by a signal and by a file change alike).
type reloader struct {
	name   string
	path   string
	every  time.Duration // how often a watcher looks at path; 0: never
	reload func()
	// watch, when set, watches path itself from its state when reloaders
	// ran (the Envoy config, a directory whose files it lists), instead of
	// the service's digest of one file.
	watch func(ctx context.Context, ticks <-chan time.Time)
}

// reloaders lists the files of the service: the token files, the
// namespaces and the Envoy config, in the order Reload reads them.
func (s *Service) reloaders() []reloader {
	c := &s.cfg
	log := c.Logger
	var out []reloader
	token := func(setting, path string, set func(string)) {
		if path == "" {
			return
		}
		out = append(out, reloader{name: setting, path: path, every: c.Watch, reload: func() {
			token, err := ReadTokenFile(setting, path)
			if err != nil {
				log.Error("token reload refused; keeping the previous token", "err", err)
				return
			}
			set(token)
			log.Info("token reloaded", "file", path)
		}})
	}
	token("--token-file", c.TokenFile, s.api.SetToken)
	token("--metrics-token-file", c.MetricsTokenFile, s.api.SetMetricsToken)
	if c.ConfigFile != "" {
		out = append(out, reloader{name: "--config", path: c.ConfigFile, every: c.Watch, reload: func() {
			s.api.Reload(c.ConfigFile) //nolint:errcheck // Reload logs the outcome
		}})
	}
	if s.envoy != nil {
		ec, svc := c.Envoy, s.envoy.svc
		out = append(out, reloader{name: "--envoy-config", path: ec.ConfigPath, every: ec.Watch,
			reload: func() { svc.Reload(ec.ConfigPath) }, //nolint:errcheck // Reload logs the outcome
			watch:  svc.Watcher(ec.ConfigPath),
		})
	}
	return out
}

// Reload reads every file the service reads again (the token files, the
// namespaces of Config.ConfigFile, the Envoy config) and puts each in force;
// a file that does not load is logged and what was in force stays. The
// command calls it on SIGHUP.
func (s *Service) Reload() {
	hasConfig := false
	for _, r := range s.reload {
		r.reload()
		hasConfig = hasConfig || r.name == "--config" || r.name == "--envoy-config"
	}
	if !hasConfig {
		s.cfg.Logger.Warn("SIGHUP: no --config file to reload; the policies stay", "policies", s.api.Policies().String())
	}
}

// watch starts a watcher for each file that has an interval, until ctx is
// done.
func (s *Service) watch(ctx context.Context) {
	for _, r := range s.reload {
		if r.every <= 0 {
			continue
		}
		tick := time.NewTicker(r.every)
		w := r.watch
		if w == nil {
			applied := digest(r.path) // now: an edit after Start is a change
			w = func(ctx context.Context, ticks <-chan time.Time) { watchFile(ctx, r.path, applied, ticks, r.reload) }
		}
		s.bgDone.Go(func() { defer tick.Stop(); w(ctx, tick.C) })
	}
}

// watchFile calls reload when the file at path changes from applied, its
// digest, until ctx is done: filewatch.Loop on the file's content,
// following symbolic links.
func watchFile(ctx context.Context, path string, applied [sha256.Size]byte, ticks <-chan time.Time, reload func()) {
	filewatch.Loop(ctx, ticks, applied, func() filewatch.State { return digest(path) }, reload, nil)
}

// digest is the SHA-256 of the file at path (filewatch.Digest), or of its
// error.
func digest(path string) [sha256.Size]byte {
	sum, _, err := filewatch.Digest(path)
	if err != nil {
		return sha256.Sum256([]byte("error " + err.Error()))
	}
	return sum
}
