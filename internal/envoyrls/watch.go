package envoyrls

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"time"
)

// Watch reloads the configuration at path (see Reload) when it changes
// from what it was when Watch started, until ctx is done. It looks at path on every tick: the files Reload would
// read (or the one file), by name, size, modification time and file
// identity, following symbolic links, so an edit in place, a file replaced
// by a rename and Kubernetes' swap of its ..data link are all seen. A change
// is put in force once the same state is seen on two ticks in a row, so an
// edit written in several steps is loaded once, when it is done. A change
// that does not load keeps the configuration in force, and Reload logs why;
// the same state is not tried again until it changes once more. Watch
// returns when ctx is done.
func (s *Service) Watch(ctx context.Context, path string, ticks <-chan time.Time) {
	applied := s.stateOf(path)
	pending := applied
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
		}
		now := s.stateOf(path)
		switch {
		case now != pending:
			pending = now // changed: wait until it holds still
		case now != applied:
			applied = now
			s.Reload(path) //nolint:errcheck // Reload logs the outcome
		}
		if s.watched != nil {
			s.watched <- struct{}{}
		}
	}
}

// stateOf is a digest of what Load would read at path: every file's name,
// size, modification time and identity. A path that cannot be listed has
// the state of its error.
func (s *Service) stateOf(path string) [sha256.Size]byte {
	h := sha256.New()
	files := []string{path}
	if fi, err := os.Stat(path); err != nil {
		fmt.Fprintf(h, "error %v", err)
		return [sha256.Size]byte(h.Sum(nil))
	} else if fi.IsDir() {
		if files, err = s.load.list(path); err != nil {
			fmt.Fprintf(h, "error %v", err)
			return [sha256.Size]byte(h.Sum(nil))
		}
	}
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			fmt.Fprintf(h, "%q error %v\n", f, err)
			continue
		}
		fmt.Fprintf(h, "%q %d %d %v\n", f, fi.Size(), fi.ModTime().UnixNano(), fileID(fi))
	}
	return [sha256.Size]byte(h.Sum(nil))
}
