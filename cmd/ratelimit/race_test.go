//go:build race

package main_test

// buildFlags build the binary under test with the race detector when the
// tests themselves run with it, so that a data race in serve fails the
// end-to-end tests too (the binary exits 66 on one).
var buildFlags = []string{"-race"}
