#!/usr/bin/env bash
# The project's one test command, for a developer's machine and for CI alike:
#   ./scripts/test.sh [extra go test flags, e.g. -run TestFoo -v]
#
# On a fresh Debian machine it installs redis-server and redis-cli (Debian's
# redis-server and redis-tools packages) and a headless browser (Debian's
# chromium package, for the operator page's browser test in cmd/ratelimit).
# No Redis service is needed or started: the tests start their own
# redis-server processes on free loopback ports (see internal/redistest).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Debian installs redis-server in /usr/bin, but a non-root PATH may lack sbin.
export PATH="$PATH:/usr/bin:/usr/sbin"

log() { printf '==> %s\n' "$*" >&2; }

# Debian's policy-rc.d hook: while it exits 101, package scripts start no
# service. Set only during our own apt-get install when none existed.
POLICY_RC=/usr/sbin/policy-rc.d
SUDO=
remove_policy() { $SUDO rm -f "$POLICY_RC"; }

# apt_install PACKAGE...: install Debian packages, as root or through sudo.
apt_install() {
	if [ "$(id -u)" -ne 0 ]; then
		if ! command -v sudo >/dev/null; then
			log "$* missing and sudo is not available: install Debian's $* as root"
			exit 1
		fi
		SUDO=sudo
	fi
	# Keep package scripts (redis-server's postinst) from starting a
	# service: the tests start their own servers.
	local own_policy=0
	if [ ! -e "$POLICY_RC" ]; then
		own_policy=1
		trap remove_policy EXIT
		printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY_RC" >/dev/null
		$SUDO chmod 755 "$POLICY_RC"
	fi
	$SUDO apt-get update
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y \
		-o DPkg::Lock::Timeout=600 --no-install-recommends "$@"
	if [ "$own_policy" = 1 ]; then
		remove_policy
		trap - EXIT
	fi
}

have_redis() { command -v redis-server >/dev/null && command -v redis-cli >/dev/null; }

if ! have_redis; then
	log "redis-server or redis-cli not found: installing Debian's redis-server and redis-tools"
	apt_install redis-server redis-tools
	have_redis || { log "redis-server still not found after apt-get install"; exit 1; }
fi
log "$(redis-server --version)"

# The operator page's test (cmd/ratelimit) drives this browser and fails
# when it is missing.
if [ ! -x /usr/bin/chromium ]; then
	log "/usr/bin/chromium not found: installing Debian's chromium"
	apt_install chromium
	[ -x /usr/bin/chromium ] || { log "/usr/bin/chromium still not found after apt-get install"; exit 1; }
fi
log "$(/usr/bin/chromium --version 2>/dev/null)"

command -v go >/dev/null || { log "go not found on PATH"; exit 1; }

# internal/doctest compiles the docs' Go snippets offline (GOPROXY=off), in a
# module of its own with this module's go.mod: a snippet may import any
# package of this module's build list (go.opentelemetry.io/otel/trace, which
# no package here imports), so every module of the build list must be in the
# module cache first. -modfile points at a copy, so that the checksums this
# records land in the copy's go.sum, not in the repository's.
log "go mod download all (the module set of the docs' snippets)"
modcopy="$(mktemp -d)"
cp go.mod go.sum "$modcopy/"
go mod download -modfile="$modcopy/go.mod" all
rm -rf "$modcopy"

log "go vet ./..."
go vet ./...

log "gofmt check"
unformatted="$(find . -path ./.git -prune -o -name '*.go' -not -path '*/testdata/*' -print0 | xargs -0 -r gofmt -l)"
if [ -n "$unformatted" ]; then
	log "these files are not gofmt-formatted (run gofmt -w on them):"
	printf '%s\n' "$unformatted" >&2
	exit 1
fi

# The default run: every package at once. It is deterministic: no test's
# pass depends on the machine's speed or load. The tests that measure (a
# detection or recovery time, a p99, a deadline kept under load) check
# their decisions here and skip or leave unchecked their timing bounds,
# saying so in -v output.
log "go test -race -count=1 -shuffle=on ./... $*"
go test -race -count=1 -shuffle=on ./... "$@"

# The timing tier: those tests again with RATELIMIT_TIMING=1, which holds
# their figures to the bounds docs/outages.md lists ("Timing bounds"), one
# package at a time (one go test each), after the default run, so
# that no other package's tests compete with them for the CPU.
# internal/doctest checks that every test calling testkit.Timed or
# testkit.Timing is named here.
# timing PACKAGE TEST...: run the named tests of PACKAGE in the timing tier.
timing() {
	local pkg=$1
	shift
	local pattern
	pattern="^($(IFS='|'; echo "$*"))\$"
	log "timing tier: RATELIMIT_TIMING=1 go test -race -count=1 -run '$pattern' $pkg $extra"
	RATELIMIT_TIMING=1 go test -race -count=1 -run "$pattern" "$pkg" "${extra_args[@]}"
}
extra_args=("$@")
extra="$*"
timing ./fallback TestRedisKilledUnderLoad TestRedisHung TestProxyDropAndStall TestClusterFailover \
	TestClusterMasterKilledPlainSetUp TestClusterMasterStopped TestHungPrimaryCostsTheDeadline TestProbe TestProbeForever
timing ./redisstore TestASlowCommandDelaysNoOtherSubject TestCoalescedCheckHonoursItsDeadline
timing ./internal/redistest TestServerStopCont TestProxyForwardsStallsAndDrops TestProxyToDeadTargetClosesConnections
timing ./internal/envoyrls TestHungRedisCostsOneTimeout
timing ./grpclimit TestCheckTimeout
timing ./cmd/ratelimit TestServeRedisClusterFailover

if [ -f bench/go.mod ]; then
	log "nested module ./bench: go vet and go test"
	# -mod=mod: the bench module follows the root module through a replace
	# directive, so a new requirement there must not fail the build here.
	# GOFLAGS keeps the caller's flags (CI's -modcacherw), from the
	# environment or go env -w.
	(cd bench && flags="$(go env GOFLAGS)" && export GOFLAGS="${flags:+$flags }-mod=mod" && go vet ./... && go test -count=1 ./...)
fi
