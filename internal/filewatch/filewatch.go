// Package filewatch reloads what a file holds when the file changes: the
// one watch loop of the service's config files (the namespaces, the token
// files) and of the Envoy service's rule files.
package filewatch

import (
	"context"
	"crypto/sha256"
	"io"
	"os"
	"time"

	"github.com/exactlimit/ratelimit/internal/units"
)

// A State is a digest of what a reload would read: equal States, nothing
// to reload.
type State = [sha256.Size]byte

// Loop calls reload each time state, read on every tick, changes from
// applied and then holds still for a tick, so that a file written in
// several steps is reloaded once, when it is done; ticked, when not nil, is
// called after each tick is handled. It returns when ctx is done.
func Loop(ctx context.Context, ticks <-chan time.Time, applied State, state func() State, reload, ticked func()) {
	pending := applied
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
		}
		now := state()
		switch {
		case now != pending:
			pending = now // changed: wait until it holds still
		case now != applied:
			applied = now
			reload()
		}
		if ticked != nil {
			ticked()
		}
	}
}

// Digest returns the SHA-256 of the file at path, of at most
// units.MaxFileSize+1 bytes (a loader refuses more), and the bytes read.
// Its content, not its size, time or inode: an edit can keep all three.
func Digest(path string) (State, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return State{}, 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, units.MaxFileSize+1))
	if err != nil {
		return State{}, n, err
	}
	return State(h.Sum(nil)), n, nil
}
