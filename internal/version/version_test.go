package version

import (
	"bufio"
	"os"
	"regexp"
	"testing"
)

// TestChangelogNamesThisVersion holds CHANGELOG.md and Version together: the
// first release heading ("## [x.y.z] - YYYY-MM-DD") must be Version.
func TestChangelogNamesThisVersion(t *testing.T) {
	if !regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`).MatchString(Version) {
		t.Fatalf("Version %q is not major.minor.patch", Version)
	}
	f, err := os.Open("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	release := regexp.MustCompile(`^## \[([^\]]+)\] - \d{4}-\d{2}-\d{2}$`)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := release.FindStringSubmatch(sc.Text()); m != nil {
			if m[1] != Version {
				t.Fatalf("CHANGELOG.md's latest release is %s, Version is %s", m[1], Version)
			}
			return
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("CHANGELOG.md has no release heading \"## [%s] - YYYY-MM-DD\"", Version)
}
