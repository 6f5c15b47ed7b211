package doctest

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit/internal/cli"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// planFile returns the YAML file of docs/plans.md's section on the
// service: its first yaml block.
func planFile(t *testing.T) block {
	t.Helper()
	bs, err := blocks("docs/plans.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		if b.lang == "yaml" {
			return b
		}
	}
	t.Fatal("docs/plans.md has no yaml block")
	return block{}
}

// TestPlansSession runs the first curl session of docs/plans.md against
// 'ratelimit serve --config' of the file it shows, and checks each answer
// against the one printed, as TestServiceSessions does.
func TestPlansSession(t *testing.T) {
	yaml := planFile(t)
	cfg := filepath.Join(t.TempDir(), "plans.yaml")
	testkit.WriteFile(t, cfg, yaml.text+"\n")
	steps := firstSession(t, "docs/plans.md")
	addr := startServe(t, "--config", cfg)
	for _, s := range steps {
		if err := s.run(addr); err != nil {
			t.Fatalf("docs/plans.md:%d: %s\n%v", s.line, s.command, err)
		}
	}
}

// TestPlansCommandLines runs the command lines docs/plans.md shows (its
// block of "$ ratelimit" lines), with the file it shows, against a real
// redis-server (for the doc's redis://localhost:6379), and checks that each
// prints what is shown after it.
func TestPlansCommandLines(t *testing.T) {
	dir := t.TempDir()
	testkit.WriteFile(t, filepath.Join(dir, "plans.yaml"), planFile(t).text+"\n")
	srv := redistest.StartServer(t)
	bs, err := blocks("docs/plans.md")
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, b := range bs {
		if b.lang != "" || !strings.HasPrefix(b.text, "$ ratelimit ") {
			continue
		}
		type command struct {
			line int
			args []string
			out  string
		}
		var cmds []command
		for i, l := range strings.Split(b.text, "\n") {
			c, ok := strings.CutPrefix(l, "$ ")
			if !ok {
				cmds[len(cmds)-1].out += l + "\n"
				continue
			}
			args, err := words(c)
			if err != nil || len(args) < 2 || args[0] != "ratelimit" {
				t.Fatalf("docs/plans.md:%d: %q is not a ratelimit command (%v)", b.line+i, l, err)
			}
			for j, a := range args {
				switch a {
				case "redis://localhost:6379":
					args[j] = "redis://" + srv.Addr()
				case "plans.yaml":
					args[j] = filepath.Join(dir, a)
				}
			}
			cmds = append(cmds, command{line: b.line + i, args: args[1:]})
		}
		for _, c := range cmds {
			var out, errOut bytes.Buffer
			code := cli.Main(context.Background(), c.args, cli.Env{Stdout: &out, Stderr: &errOut})
			if code != 0 || out.String() != c.out {
				t.Errorf("docs/plans.md:%d: exit %d, %q %q; want %q", c.line, code, out.String(), errOut.String(), c.out)
			}
			ran++
		}
	}
	if ran == 0 {
		t.Fatal("docs/plans.md shows no ratelimit command line")
	}
}
