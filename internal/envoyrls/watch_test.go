package envoyrls

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// watcher runs Service.Watch on path with ticks the test sends; tick
// returns once the Watch loop has handled them.
type watcher struct {
	svc   *Service
	ticks chan time.Time
	log   *testkit.Buffer
	m     *Metrics
}

func watch(t *testing.T, path string, o LoadOptions) *watcher {
	t.Helper()
	cfg, err := o.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	w := &watcher{ticks: make(chan time.Time), log: &testkit.Buffer{}, m: NewMetrics(0)}
	w.svc, err = New(Options{Store: memstore.New(), Config: cfg, Load: o, Metrics: w.m, Logger: slog.New(slog.NewTextHandler(w.log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	w.svc.watched = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.svc.Watch(ctx, path, w.ticks); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	w.tick(1) // Watch has taken the state to compare with
	return w
}

// tick sends n ticks, each once the one before has been handled, and
// returns when the last has been.
func (w *watcher) tick(n int) {
	for range n {
		w.ticks <- time.Time{}
		<-w.svc.watched
	}
}

func (w *watcher) domains() string { return strings.Join(w.svc.Config().Domains(), ",") }

func domainFile(domain string) string {
	return "domain: " + domain + "\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n"
}

func TestWatchReloadsAnEditedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	testkit.WriteFile(t, path, domainFile("a"))
	w := watch(t, path, LoadOptions{})
	w.tick(3)
	if got := testutil.ToFloat64(w.m.reloads.WithLabelValues("ok")); got != 0 {
		t.Fatalf("reloaded %v times with no change", got)
	}
	testkit.WriteFile(t, path, domainFile("bb"))
	w.tick(1)
	if got := w.domains(); got != "a" {
		t.Fatalf("after one tick: %s; a change waits until it holds still", got)
	}
	w.tick(1)
	if got := w.domains(); got != "bb" {
		t.Fatalf("after two ticks: %s, want bb", got)
	}
	// A bad edit keeps the config in force, says why, and is not retried
	// until the file changes again.
	testkit.WriteFile(t, path, "domain: c\ndescriptors:\n  - {key: k, rate_limit: {unit: fortnight, requests_per_unit: 1}}\n")
	w.tick(4)
	if got := w.domains(); got != "bb" {
		t.Fatalf("after a bad edit: %s, want bb kept", got)
	}
	if got := testutil.ToFloat64(w.m.reloads.WithLabelValues("error")); got != 1 {
		t.Errorf("refused reloads: %v, want 1", got)
	}
	if !strings.Contains(w.log.String(), "fortnight") || !strings.Contains(w.log.String(), "keeping the previous config") {
		t.Errorf("the log does not say why:\n%s", w.log.String())
	}
	testkit.WriteFile(t, path, domainFile("ddd"))
	w.tick(2)
	if got := w.domains(); got != "ddd" {
		t.Fatalf("after a fix: %s, want ddd", got)
	}
}

func TestWatchDebouncesAnEditInSteps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	testkit.WriteFile(t, path, domainFile("a"))
	w := watch(t, path, LoadOptions{})
	for _, step := range []string{"domain: b\n", domainFile("b")[:20], domainFile("bb")} {
		testkit.WriteFile(t, path, step)
		w.tick(1) // each step seen once: not loaded
	}
	if got := testutil.ToFloat64(w.m.reloads.WithLabelValues("error")); got != 0 {
		t.Errorf("a half-written file was loaded (%v refused reloads)", got)
	}
	w.tick(1)
	if got := w.domains(); got != "bb" {
		t.Fatalf("got %s, want bb once the edit held still", got)
	}
	if got := testutil.ToFloat64(w.m.reloads.WithLabelValues("ok")); got != 1 {
		t.Errorf("reloads: %v, want 1", got)
	}
}

// TestWatchKubernetesSwap: a ConfigMap volume is files linked through
// ..data to a timestamped directory; an update writes a new directory and
// swaps the ..data link with a rename.
func TestWatchKubernetesSwap(t *testing.T) {
	dir := t.TempDir()
	testkit.WriteFile(t, filepath.Join(dir, "..2026_01_01_00_00_00.1", "edge.yaml"), domainFile("a"))
	if err := os.Symlink("..2026_01_01_00_00_00.1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/edge.yaml", filepath.Join(dir, "edge.yaml")); err != nil {
		t.Fatal(err)
	}
	w := watch(t, dir, LoadOptions{})
	if got := w.domains(); got != "a" {
		t.Fatalf("loaded %s, want a (the timestamped directory is not read twice)", got)
	}
	testkit.WriteFile(t, filepath.Join(dir, "..2026_01_01_00_01_00.2", "edge.yaml"), domainFile("b"))
	if err := os.Symlink("..2026_01_01_00_01_00.2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2026_01_01_00_00_00.1")); err != nil {
		t.Fatal(err)
	}
	w.tick(2)
	if got := w.domains(); got != "b" {
		t.Fatalf("after the swap: %s, want b", got)
	}
}

// TestWatchSeesAnEditOfTheSameSizeAndTime: an edit that keeps the file's
// size, modification time and inode (a rewrite in place, its time set back
// as rsync -t or a restore does) is still a change.
func TestWatchSeesAnEditOfTheSameSizeAndTime(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	testkit.WriteFile(t, path, domainFile("a"))
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	w := watch(t, path, LoadOptions{})
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(domainFile("b")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.Stat(path); now.Size() != fi.Size() || !now.ModTime().Equal(fi.ModTime()) {
		t.Fatalf("the rewrite changed the size or the time: %d %v, was %d %v", now.Size(), now.ModTime(), fi.Size(), fi.ModTime())
	}
	w.tick(2)
	if got := w.domains(); got != "b" {
		t.Fatalf("after a rewrite of the same size and time: %s, want b", got)
	}
}
