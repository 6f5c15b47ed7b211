// Package doctest holds the tests of the documentation: every Go snippet of
// README.md and docs/*.md compiles, the first session of the service shown
// in README.md and docs/service.md gives the answers printed there, and
// every identifier that a comment of the module's code or a page cites
// exists. It has no code of its own.
package doctest
