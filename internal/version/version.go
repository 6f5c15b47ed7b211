// Package version holds the release version of this module, the one place it
// is written: the ratelimit command prints it (--version), serves it
// (ratelimit_build_info, GET /v1/config), and CHANGELOG.md's latest release
// carries the same number.
package version

// Version is the release version, in semantic versioning without the "v"
// that the module's tag carries (the tag of this release is "v" + Version).
const Version = "0.2.0"
