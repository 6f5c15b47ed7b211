package cli

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
)

// The peer's defaults for where it listens and where its config lives
// (envoyproxy/ratelimit's src/settings/settings.go).
const (
	peerDefaultHost        = "0.0.0.0"
	peerDefaultPort        = "8080"
	peerDefaultGRPCPort    = "8081"
	peerDefaultDebugPort   = "6070"
	peerDefaultRuntimeRoot = "/srv/runtime_data/current"
	peerDefaultAppDir      = "config"
)

// peerEnvoyVars are the peer's settings whose presence says serve runs as
// the peer's container: the Envoy service on GRPC_HOST:GRPC_PORT with the
// config of RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, the
// others taking the peer's defaults.
var peerEnvoyVars = []string{"GRPC_HOST", "GRPC_PORT", "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"}

// peerListen is where serve listens and reads the Envoy config by the
// peer's settings, for what the flags leave unset.
type peerListen struct {
	// envoy says the peer's settings ask for the Envoy service (one of
	// peerEnvoyVars is set).
	envoy bool
	// http, grpc and debug are the listeners' addresses, "" where no peer
	// setting names one (nor, for grpc and debug, envoy).
	http, grpc, debug string
	// config is the Envoy config's directory, "" unless envoy.
	config string
	// won are the pairs of flag and setting where a flag wins, for the log.
	won [][2]string
}

// readPeerListen reads the peer's HOST, PORT, GRPC_HOST, GRPC_PORT,
// DEBUG_HOST, DEBUG_PORT, RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and
// RUNTIME_APPDIRECTORY through getenv, where the flags in set (--listen,
// --grpc-listen, --debug-listen, --envoy-config) do not name the same
// thing: a flag wins, and the pair is in won. HOST or PORT alone moves the
// HTTP listener; one of peerEnvoyVars starts the Envoy service, with the
// HTTP and debug listeners on the peer's defaults (0.0.0.0:8080 and
// 0.0.0.0:6070) unless set. A port that is not a number from 0 to 65535 is
// a usage error naming the variable. RUNTIME_WATCH_ROOT needs nothing here:
// the directory is watched by content, which sees both the peer's ways of
// changing it (see docs/envoy.md).
func readPeerListen(getenv func(string) string, set map[string]bool) (peerListen, error) {
	var p peerListen
	if getenv == nil {
		return p, nil
	}
	get := func(name string) string { return strings.TrimSpace(getenv(name)) }
	for _, name := range peerEnvoyVars {
		if get(name) != "" {
			p.envoy = true
		}
	}
	addr := func(flag, hostVar, portVar, defPort string, always bool) (string, error) {
		host, port := get(hostVar), get(portVar)
		if host == "" && port == "" && !always {
			return "", nil
		}
		if port != "" {
			if n, err := strconv.ParseUint(port, 10, 16); err != nil || n > 65535 {
				return "", usagef("%s=%q: want a port number from 0 to 65535", portVar, port)
			}
		}
		if set[flag] {
			switch {
			case host != "":
				p.won = append(p.won, [2]string{"--" + flag, hostVar})
			case port != "":
				p.won = append(p.won, [2]string{"--" + flag, portVar})
			}
			return "", nil
		}
		if host == "" {
			host = peerDefaultHost
		}
		if port == "" {
			port = defPort
		}
		return net.JoinHostPort(host, port), nil
	}
	var err error
	if p.http, err = addr("listen", "HOST", "PORT", peerDefaultPort, p.envoy); err != nil {
		return p, err
	}
	if p.grpc, err = addr("grpc-listen", "GRPC_HOST", "GRPC_PORT", peerDefaultGRPCPort, p.envoy); err != nil {
		return p, err
	}
	if p.debug, err = addr("debug-listen", "DEBUG_HOST", "DEBUG_PORT", peerDefaultDebugPort, p.envoy); err != nil {
		return p, err
	}
	root, sub, app := get("RUNTIME_ROOT"), get("RUNTIME_SUBDIRECTORY"), get("RUNTIME_APPDIRECTORY")
	switch {
	case set["envoy-config"]:
		for _, v := range [][2]string{{"RUNTIME_ROOT", root}, {"RUNTIME_SUBDIRECTORY", sub}, {"RUNTIME_APPDIRECTORY", app}} {
			if v[1] != "" {
				p.won = append(p.won, [2]string{"--envoy-config", v[0]})
			}
		}
	case p.envoy:
		if root == "" {
			root = peerDefaultRuntimeRoot
		}
		if app == "" {
			app = peerDefaultAppDir
		}
		p.config = filepath.Join(root, sub, app)
	}
	return p, nil
}

// apply sets the flags' values that p names: the HTTP listener, the Envoy
// service's listener and config, and the debug listener.
func (p peerListen) apply(f *serveFlags, e *envoyFlags) {
	if p.http != "" {
		f.listen = p.http
	}
	if p.grpc != "" {
		e.listen = p.grpc
	}
	if p.debug != "" {
		f.debugListen = p.debug
	}
	if p.config != "" {
		e.config = p.config
	}
}
