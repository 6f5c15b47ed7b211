package envoyrls

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"time"

	"github.com/exactlimit/ratelimit/internal/filewatch"
)

// Watch reloads the configuration at path (see Reload) when it changes
// from what it was when Watch started, until ctx is done. It looks at path on
// every tick: the files Reload would read (or the one file), by name and
// content, following symbolic links, so an edit in place (even one that
// keeps the size and the modification time), a file replaced by a rename
// and Kubernetes' swap of its ..data link are all seen. A change is put in
// force once the same state is seen on two ticks in a row, so an edit
// written in several steps is loaded once, when it is done. A change that
// does not load keeps the configuration in force, and Reload logs why; the
// same state is not tried again until it changes once more. Watch returns
// when ctx is done.
func (s *Service) Watch(ctx context.Context, path string, ticks <-chan time.Time) {
	s.Watcher(path)(ctx, ticks)
}

// Watcher returns Watch of path from the state path has now, not when the
// returned function starts: call it before starting a goroutine, and a
// change made once it has returned is seen.
func (s *Service) Watcher(path string) func(ctx context.Context, ticks <-chan time.Time) {
	applied := s.stateOf(path)
	return func(ctx context.Context, ticks <-chan time.Time) { s.watch(ctx, path, applied, ticks) }
}

// watch is Watch from the state applied.
func (s *Service) watch(ctx context.Context, path string, applied [sha256.Size]byte, ticks <-chan time.Time) {
	var ticked func()
	if s.watched != nil {
		ticked = func() { s.watched <- struct{}{} }
	}
	filewatch.Loop(ctx, ticks, applied, func() filewatch.State { return s.stateOf(path) },
		func() { s.Reload(path) }, //nolint:errcheck // Reload logs the outcome
		ticked)
}

// stateOf is a digest of what Load would read at path: every file's name
// and content (up to one byte past units.MaxFileSize, which Load refuses).
// A file's size, time and inode are not enough: an edit can keep all three.
// A path that cannot be listed has the state of its error, a file that
// cannot be read that of its name and error.
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
		sum, n, err := filewatch.Digest(f)
		if err != nil {
			fmt.Fprintf(h, "%q error %v\n", f, err)
			continue
		}
		fmt.Fprintf(h, "%q %d %x\n", f, n, sum)
	}
	return [sha256.Size]byte(h.Sum(nil))
}
