package doctest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit/internal/testkit"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// block is one fenced block of a markdown file.
type block struct {
	file string // relative to root, as the failure messages name it
	line int    // the line of the block's first line of text, 1-based
	lang string // the fence's info string: "go", "sh", ""
	text string
}

// goBlocks returns the Go snippets of README.md and docs/*.md, in order;
// the test fails when there is none.
func goBlocks(t *testing.T) []block {
	t.Helper()
	var out []block
	for _, file := range docFiles(t) {
		bs, err := blocks(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			if b.lang == "go" {
				out = append(out, b)
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no ```go block found")
	}
	return out
}

// docFiles returns README.md and docs/*.md, relative to root.
func docFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

// blocks returns the fenced blocks (```lang ... ```) of the markdown file.
// A block left open is an error.
func blocks(file string) ([]block, error) {
	data, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		return nil, err
	}
	var out []block
	var cur *block
	var lines []string
	for i, l := range strings.Split(string(data), "\n") {
		switch {
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &block{file: file, line: i + 2, lang: strings.TrimSpace(strings.TrimPrefix(l, "```"))}
			lines = nil
		case cur != nil && strings.TrimSpace(l) == "```":
			cur.text = strings.Join(lines, "\n")
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			lines = append(lines, l)
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: a fenced block is never closed", file, cur.line-1)
	}
	return out, nil
}

// imports are the packages a fragment may use without importing them: the
// snippet test imports each one whose name the fragment uses ("name.").
var imports = map[string]string{
	"context":      "context",
	"errors":       "errors",
	"fmt":          "fmt",
	"log":          "log",
	"math":         "math",
	"http":         "net/http",
	"os":           "os",
	"strconv":      "strconv",
	"time":         "time",
	"atomic":       "sync/atomic",
	"debug":        "runtime/debug",
	"ratelimit":    "github.com/exactlimit/ratelimit",
	"fallback":     "github.com/exactlimit/ratelimit/fallback",
	"httplimit":    "github.com/exactlimit/ratelimit/httplimit",
	"grpclimit":    "github.com/exactlimit/ratelimit/grpclimit",
	"memstore":     "github.com/exactlimit/ratelimit/memstore",
	"redisstore":   "github.com/exactlimit/ratelimit/redisstore",
	"promobserver": "github.com/exactlimit/ratelimit/promobserver",
	"otelobserver": "github.com/exactlimit/ratelimit/otelobserver",
	"redis":        "github.com/redis/go-redis/v9",
	"logging":      "github.com/redis/go-redis/v9/logging",
	"prometheus":   "github.com/prometheus/client_golang/prometheus",
	"promhttp":     "github.com/prometheus/client_golang/prometheus/promhttp",
	"trace":        "go.opentelemetry.io/otel/trace",
	"grpc":         "google.golang.org/grpc",
	"codes":        "google.golang.org/grpc/codes",
	"status":       "google.golang.org/grpc/status",
}

// preamble declares what fragments assume, at package level, so that a
// fragment's own := declarations shadow them freely.
const preamble = `package snippet

import (
	"context"
	"net/http"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
)

var (
	ctx     = context.Background()
	client  redis.UniversalClient      // a client built with redisstore.ClientOptions
	store   *redisstore.Store          // redisstore.New(client)
	limiter *ratelimit.Limiter[string] // a limiter on store
	limit   ratelimit.Limit            // a policy
	promObs  ratelimit.Observer         // promobserver.New()
	provider metric.MeterProvider       // an OpenTelemetry SDK's
	w       http.ResponseWriter        // in an HTTP handler
	r       *http.Request
	email   string // subjects
	apiKey  string
)

var _ = time.Second // for the snippets that name durations

// BatchRequest stands for a gRPC request message of the reader's own.
type BatchRequest struct{ Items []string }
`

// snippetFile returns the Go file that compiles b: b itself when it is a
// whole file (it starts with a package clause), else b wrapped as the body of
// a function in package snippet. The function returns an error when b
// returns a value at its top level; the names b declares at its top level
// are marked used, since a fragment leaves them to the reader (names in
// nested blocks must be used). Each part carries a //line directive, so the
// compiler names the markdown file and line.
func snippetFile(b block) string {
	here := fmt.Sprintf("//line %s:%d\n", b.file, b.line)
	if strings.HasPrefix(strings.TrimSpace(b.text), "package ") {
		return here + b.text + "\n"
	}
	returnsValue, declared := inspectFragment(b.text)
	var f strings.Builder
	f.WriteString("package snippet\n\n")
	var used []string
	for name, path := range imports {
		if regexp.MustCompile(`(^|[^\w.])` + name + `\.`).MatchString(b.text) {
			used = append(used, fmt.Sprintf("%s %q", name, path))
		}
	}
	sort.Strings(used)
	if len(used) > 0 {
		f.WriteString("import (\n\t" + strings.Join(used, "\n\t") + "\n)\n\n")
	}
	if returnsValue {
		f.WriteString("func snippet() error {\n")
	} else {
		f.WriteString("func snippet() {\n")
	}
	f.WriteString(here + b.text + "\n")
	f.WriteString("//line snippet_wrapper.go:1\n")
	for _, name := range declared {
		f.WriteString("\t_ = " + name + "\n")
	}
	if returnsValue {
		f.WriteString("\treturn nil\n")
	}
	f.WriteString("}\n")
	return f.String()
}

// inspectFragment reports whether the fragment returns a value at its top
// level (outside function literals), and the names it declares there. A
// fragment that does not parse gets neither: the compiler then says why.
func inspectFragment(text string) (returnsValue bool, declared []string) {
	file, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc f() {\n"+text+"\n}\n", 0)
	if err != nil {
		return false, nil
	}
	body := file.Decls[0].(*ast.FuncDecl).Body
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ReturnStmt:
			if len(n.Results) > 0 {
				returnsValue = true
			}
		}
		return true
	})
	add := func(id *ast.Ident) {
		if id.Name != "_" && !slices.Contains(declared, id.Name) {
			declared = append(declared, id.Name)
		}
	}
	for _, st := range body.List {
		switch st := st.(type) {
		case *ast.AssignStmt:
			if st.Tok == token.DEFINE {
				for _, e := range st.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						add(id)
					}
				}
			}
		case *ast.DeclStmt:
			if g, ok := st.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, s := range g.Specs {
					for _, id := range s.(*ast.ValueSpec).Names {
						add(id)
					}
				}
			}
		}
	}
	return returnsValue, declared
}

// TestDocSnippetsCompile builds every ```go block of README.md and
// docs/*.md, in a module of its own that uses this repository through a
// replace directive, offline (GOPROXY=off), from the module cache, which
// must hold every module of this repository's build list: scripts/test.sh
// runs go mod download all first. A failure names the markdown file and
// line of each error.
func TestDocSnippetsCompile(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to compile the snippets: %v", err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// The repository's own requirements, so that every package a snippet
	// imports resolves to a version go.sum holds.
	gomod := regexp.MustCompile(`(?m)^module .*$`).ReplaceAllString(string(mod), "module doctest.invalid/snippets") +
		"\nrequire github.com/exactlimit/ratelimit v0.0.0\n\nreplace github.com/exactlimit/ratelimit => " + abs + "\n"
	write := func(name, text string) {
		t.Helper()
		testkit.WriteFile(t, filepath.Join(dir, name), text)
	}
	write("go.mod", gomod)
	write("go.sum", string(sum))

	n := 0
	perFile := map[string]int{}
	for _, b := range goBlocks(t) {
		n++
		perFile[b.file]++
		pkg := fmt.Sprintf("s%03d", n)
		src := snippetFile(b)
		write(pkg+"/snippet.go", src)
		if !strings.HasPrefix(src, fmt.Sprintf("//line %s:%d\npackage ", b.file, b.line)) {
			write(pkg+"/preamble.go", preamble)
		}
	}
	// -trimpath keeps the temporary directory out of the build cache's
	// keys, so that every run after the first reuses the compiled packages
	// of this repository and its dependencies.
	cmd := exec.Command(goTool, "build", "-trimpath", "./...")
	cmd.Dir = dir
	// GOFLAGS keeps the caller's flags (CI's -modcacherw, without which the
	// module cache it extracts into could not be removed).
	goflags := strings.TrimSpace(os.Getenv("GOFLAGS") + " -mod=mod")
	cmd.Env = append(os.Environ(), "GOFLAGS="+goflags, "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the Go snippets of the docs do not compile (positions are the markdown file's lines):\n%s", out)
	}
	t.Logf("%d Go snippets compiled: %v", n, perFile)
}
