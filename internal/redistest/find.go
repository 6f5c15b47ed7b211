package redistest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// notFoundMsg is the single line a test fails with when the Redis binaries
// are missing.
const notFoundMsg = "redis-server not found: run ./scripts/test.sh (it installs Debian's redis-server) or apt-get install redis-server"

// fallbackDirs are searched after PATH, because /usr/sbin is often missing
// from a non-root PATH.
var fallbackDirs = []string{"/usr/bin", "/usr/sbin", "/usr/local/bin"}

// Find returns the paths of the redis-server and redis-cli binaries, looked
// up on PATH and then in /usr/bin, /usr/sbin and /usr/local/bin. When either
// is missing it fails the test with one line telling how to install them; it
// never skips.
func Find(t testing.TB) (serverPath, cliPath string) {
	t.Helper()
	return findIn(t, fallbackDirs)
}

func findIn(t testing.TB, dirs []string) (serverPath, cliPath string) {
	t.Helper()
	serverPath, cliPath, ok := find(dirs)
	if !ok {
		t.Fatal(notFoundMsg)
		return "", ""
	}
	return serverPath, cliPath
}

func find(dirs []string) (serverPath, cliPath string, ok bool) {
	serverPath = lookPath("redis-server", dirs)
	cliPath = lookPath("redis-cli", dirs)
	return serverPath, cliPath, serverPath != "" && cliPath != ""
}

func lookPath(name string, dirs []string) string {
	if p, err := exec.LookPath(name); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs
		}
		return p
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p
		}
	}
	return ""
}
