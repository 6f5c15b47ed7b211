package redistest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestFind(t *testing.T) {
	server, cli := Find(t)
	for _, p := range []string{server, cli} {
		fi, err := os.Stat(p)
		if err != nil || !filepath.IsAbs(p) || fi.Mode().Perm()&0o111 == 0 {
			t.Errorf("Find returned %q: not an absolute path to an executable (%v)", p, err)
		}
	}
	if filepath.Base(server) != "redis-server" || filepath.Base(cli) != "redis-cli" {
		t.Errorf("Find() = %q, %q", server, cli)
	}
}

// recordingTB captures Fatal instead of ending the test.
type recordingTB struct {
	testing.TB
	fatals []string
	skips  int
}

func (r *recordingTB) Helper()                   {}
func (r *recordingTB) Fatal(args ...any)         { r.fatals = append(r.fatals, fmt.Sprint(args...)) }
func (r *recordingTB) Fatalf(f string, a ...any) { r.fatals = append(r.fatals, fmt.Sprintf(f, a...)) }
func (r *recordingTB) Skip(...any)               { r.skips++ }
func (r *recordingTB) Skipf(string, ...any)      { r.skips++ }
func (r *recordingTB) SkipNow()                  { r.skips++ }

func TestFindMissingFailsWithOneLine(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	rec := &recordingTB{TB: t}
	server, cli := findIn(rec, []string{t.TempDir()})
	if server != "" || cli != "" {
		t.Errorf("findIn with nothing installed = %q, %q; want empty", server, cli)
	}
	if rec.skips != 0 {
		t.Errorf("findIn skipped %d times; it must fail instead", rec.skips)
	}
	const want = "redis-server not found: run ./scripts/test.sh (it installs Debian's redis-server) or apt-get install redis-server"
	if len(rec.fatals) != 1 || rec.fatals[0] != want {
		t.Errorf("findIn failures = %q; want exactly [%q]", rec.fatals, want)
	}
}

func TestFindUsesFallbackDirs(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"redis-server", "redis-cli"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", t.TempDir())
	server, cli := findIn(t, []string{dir})
	if server != filepath.Join(dir, "redis-server") || cli != filepath.Join(dir, "redis-cli") {
		t.Errorf("findIn = %q, %q; want the binaries in %s", server, cli, dir)
	}
}
