package doctest

import (
	"regexp"
	"strings"
	"testing"
)

// credential matches a Go identifier that names a credential: apiKey,
// api_key, secret, password, bearerToken...
var credential = `(?i:\w*(?:api_?key|secret|password|passwd|credential|bearer)\w*)`

// inTheClear matches a credential passed as a call's argument, with what
// precedes it: the function's name when it is the first argument.
var inTheClear = regexp.MustCompile(`(\w*)\(\s*` + credential + `\s*[,)]|,\s*` + credential + `\s*[,)]`)

// TestDocsNeverKeyByACredentialInTheClear: no Go snippet of README.md and
// docs/*.md passes a credential (an API key) as an argument, a subject
// above all, but through ratelimit.HashSubject: a reader copies what the
// snippet shows, and a credential as a subject sits in the store's keys and
// in every reservation's record.
func TestDocsNeverKeyByACredentialInTheClear(t *testing.T) {
	for _, b := range goBlocks(t) {
		for i, line := range strings.Split(b.text, "\n") {
			code, _, _ := strings.Cut(line, "//")
			for _, m := range inTheClear.FindAllStringSubmatch(code, -1) {
				if m[1] != "HashSubject" {
					t.Errorf("%s:%d: a credential in the clear, %q: pass ratelimit.HashSubject(it)", b.file, b.line+i, strings.TrimSpace(m[0]))
				}
			}
		}
	}
}
