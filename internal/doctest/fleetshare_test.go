package doctest

import (
	"strings"
	"testing"
)

// TestDocsLocalFallbackSetsAFleetShare: every fallback.New of a Go snippet
// of README.md and docs/*.md that chooses LocalFallback also sets
// WithFleetShare. Without it each process's local bucket admits the whole
// policy while Redis is down, and a fleet of n admits n times it: a reader
// copies the snippet, not the paragraph that warns.
func TestDocsLocalFallbackSetsAFleetShare(t *testing.T) {
	n := 0
	for _, b := range goBlocks(t) {
		for rest, at := b.text, 0; ; {
			i := strings.Index(rest, "fallback.New(")
			if i < 0 {
				break
			}
			call := rest[i : i+callLen(rest[i:])]
			line := b.line + strings.Count(b.text[:at+i], "\n")
			if strings.Contains(call, "LocalFallback") {
				n++
				if !strings.Contains(call, "WithFleetShare(") {
					t.Errorf("%s:%d: fallback.New with LocalFallback and no WithFleetShare: each replica would admit the whole policy during an outage", b.file, line)
				}
			}
			at += i + len(call)
			rest = b.text[at:]
		}
	}
	if n == 0 {
		t.Fatal("no fallback.New with LocalFallback found in the docs' Go snippets")
	}
}

// callLen returns the length of the call that s starts with, up to and
// including the parenthesis that closes its first one (all of s when none
// does).
func callLen(s string) int {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return len(s)
}
