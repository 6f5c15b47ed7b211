// Package redistest starts real redis-server processes for tests: standalone
// servers, Redis Cluster deployments with replicas, and a loopback TCP proxy
// that can drop or blackhole connections for fault-injection tests.
//
// Every process is bound to 127.0.0.1 on a free port, runs in a t.TempDir()
// working directory without persistence, is killed by t.Cleanup, and dies
// together with the test binary (Pdeathsig on Linux). Nothing here ever uses a
// shared server on the default port 6379, and a missing redis-server binary
// fails the test instead of skipping it (see [Find]).
//
// The binaries come from Debian's redis-server and redis-tools packages;
// ./scripts/test.sh installs them when they are missing.
package redistest
