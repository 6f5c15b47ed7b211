package doctest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// timedTests returns the tests of the module (bench/, a module of its own,
// aside) that call testkit.Timed or testkit.Timing in their own body, as
// "./dir TestName", dir relative to root.
func timedTests(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "bench", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		for _, decl := range file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Body == nil {
				continue
			}
			timed := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok && x.Name == "testkit" && (sel.Sel.Name == "Timed" || sel.Sel.Name == "Timing") {
						timed = true
					}
				}
				return !timed
			})
			if timed {
				out = append(out, "./"+filepath.ToSlash(rel)+" "+fn.Name.Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// tierTests returns the tests scripts/test.sh runs in the timing tier: the
// arguments of its "timing ./dir Test..." lines, as "./dir TestName".
func tierTests(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "scripts", "test.sh"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(strings.ReplaceAll(string(data), "\\\n", " "), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "timing" || !strings.HasPrefix(f[1], "./") {
			continue
		}
		for _, name := range f[2:] {
			out = append(out, f[1]+" "+name)
		}
	}
	slices.Sort(out)
	return out
}

// TestTimingTierIsComplete checks that the timing tier runs every test
// that holds a measurement to a bound with RATELIMIT_TIMING=1 and nothing
// else: each test that calls testkit.Timed or testkit.Timing is named on a
// "timing" line of scripts/test.sh, each test named there calls one, and
// docs/outages.md's "Timing bounds" section names each one.
func TestTimingTierIsComplete(t *testing.T) {
	code, tier := timedTests(t), tierTests(t)
	if len(code) == 0 {
		t.Fatal("no test calls testkit.Timed or testkit.Timing")
	}
	for _, c := range code {
		if !slices.Contains(tier, c) {
			t.Errorf("%s calls testkit.Timed or testkit.Timing, but scripts/test.sh's timing tier does not run it: add it to the package's timing line", c)
		}
	}
	for _, c := range tier {
		if !slices.Contains(code, c) {
			t.Errorf("scripts/test.sh's timing tier runs %s, which does not call testkit.Timed or testkit.Timing (renamed, or no longer measured?)", c)
		}
	}
	data, err := os.ReadFile(filepath.Join(root, "docs", "outages.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Timing bounds\n")
	if !ok {
		t.Fatal(`docs/outages.md has no "## Timing bounds" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for _, c := range code {
		dir, name, _ := strings.Cut(c, " ")
		if !strings.Contains(section, "'^"+name+"$' "+dir+"`") {
			t.Errorf("docs/outages.md's Timing bounds do not give the command that checks %s (RATELIMIT_TIMING=1 go test -race -count=1 -run '^%s$' %s)", c, name, dir)
		}
	}
}
