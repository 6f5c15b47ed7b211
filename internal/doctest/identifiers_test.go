package doctest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// pkg is what one directory of Go files declares: its package name, its
// top-level names, and each type's members (fields, methods, and for an
// interface its methods), with the types it embeds.
type pkg struct {
	dir     string // relative to root
	name    string
	decls   map[string]bool            // top-level names
	types   map[string]bool            // the top-level names that are types
	members map[string]map[string]bool // type -> field and method names
	embeds  map[string][]string        // type -> embedded type names, "T" or "pkg.T"
}

// module holds every package of the module, the bench module's too (the
// performance page cites its benchmarks), by directory and by name.
type module struct {
	byDir  map[string]*pkg
	byName map[string][]*pkg
}

// loadModule parses every .go file under root, test files included (a
// comment may cite a test), skipping testdata and hidden directories.
func loadModule(t *testing.T) *module {
	t.Helper()
	m := &module{byDir: map[string]*pkg{}, byName: map[string][]*pkg{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (n == "testdata" || strings.HasPrefix(n, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		p := m.byDir[dir]
		if p == nil {
			p = &pkg{dir: dir, decls: map[string]bool{}, types: map[string]bool{}, members: map[string]map[string]bool{}, embeds: map[string][]string{}}
			m.byDir[dir] = p
		}
		if name := f.Name.Name; !strings.HasSuffix(name, "_test") || p.name == "" {
			p.name = strings.TrimSuffix(name, "_test")
		}
		p.add(f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.byDir {
		m.byName[p.name] = append(m.byName[p.name], p)
	}
	return m
}

// add records the declarations of f.
func (p *pkg) add(f *ast.File) {
	member := func(typ, name string) {
		if p.members[typ] == nil {
			p.members[typ] = map[string]bool{}
		}
		p.members[typ][name] = true
	}
	fields := func(typ string, fl *ast.FieldList) {
		if fl == nil {
			return
		}
		for _, fd := range fl.List {
			for _, n := range fd.Names {
				member(typ, n.Name)
			}
			if len(fd.Names) == 0 { // embedded
				if e := typeName(fd.Type); e != "" {
					p.embeds[typ] = append(p.embeds[typ], e)
					member(typ, e[strings.LastIndex(e, ".")+1:])
				}
			}
		}
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				p.decls[d.Name.Name] = true
				continue
			}
			if r := typeName(d.Recv.List[0].Type); r != "" {
				member(r, d.Name.Name)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					p.decls[s.Name.Name] = true
					p.types[s.Name.Name] = true
					switch ty := s.Type.(type) {
					case *ast.StructType:
						fields(s.Name.Name, ty.Fields)
					case *ast.InterfaceType:
						fields(s.Name.Name, ty.Methods)
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						p.decls[n.Name] = true
					}
				}
			}
		}
	}
}

// typeName returns the name of a receiver or embedded type: T for T, *T,
// T[K] and *T[K], pkg.T for a qualified one, "" for any other expression.
func typeName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return typeName(x.X)
	case *ast.IndexExpr:
		return typeName(x.X)
	case *ast.IndexListExpr:
		return typeName(x.X)
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		if id, ok := x.X.(*ast.Ident); ok {
			return id.Name + "." + x.Sel.Name
		}
	}
	return ""
}

// hasMember reports whether type typ of p has member name, its own or
// promoted from a type it embeds (of p, or of a module package it names).
func (m *module) hasMember(p *pkg, typ, name string, depth int) bool {
	if p.members[typ][name] {
		return true
	}
	if depth > 4 {
		return false
	}
	for _, e := range p.embeds[typ] {
		ep, et := p, e
		if i := strings.IndexByte(e, '.'); i >= 0 {
			ps := m.byName[e[:i]]
			if len(ps) == 0 {
				return true // a type of another module: its members are not known here
			}
			ep, et = ps[0], e[i+1:]
		}
		if m.hasMember(ep, et, name, depth+1) {
			return true
		}
	}
	return false
}

// External names a comment or page cites that no package of this module
// declares. Each is skipped deliberately; a name not listed here and
// declared nowhere in the module is a stale citation.
var (
	// externalPackages are the packages, of the standard library and of
	// the module's dependencies, whose names a comment or page cites as
	// pkg.Name; the test does not read them, so such a citation is
	// skipped. (A lowercase x in x.Name that names no package is a
	// variable, r.Cost, whose Name must be a field or method of a type of
	// the module, or listed in externalNames.)
	externalPackages = setOf(
		"atomic", "bufio", "bytes", "codes", "context", "durationpb", "errors", "exec", "filepath",
		"fmt", "grpc", "http", "httptest", "httputil", "io", "json", "keepalive", "log", "logging",
		"math", "metadata", "metric", "net", "netip", "os", "otel", "prometheus", "promhttp", "rand",
		"redis", "runtime", "signal", "slog", "sort", "status", "strconv", "strings", "sync",
		"syscall", "testing", "time", "trace", "url",
		// The store written elsewhere of package storetest's example.
		"mystore",
	)
	// externalNames are the types, fields and functions of other modules
	// that a comment or page names without their package, and the proper
	// nouns of two humps.
	externalNames = setOf(
		// go-redis: its clients, their options and methods.
		"ClusterClient", "UniversalClient", "UniversalOptions", "ParseURL", "MaxRetries", "MaxRedirects",
		"DialerRetries", "ContextTimeoutEnabled", "ClusterStateReloadInterval", "ForEachMaster",
		"ReloadState", "MasterForKey", "Exec",
		// testing, net/http, net/http/httputil, context, gRPC.
		"Cleanup", "TempDir", "RunParallel",
		"MaxHeaderBytes", "IdleTimeout", "RemoteAddr", "Pattern", "ReverseProxy", "SetXForwarded", "WithoutCancel",
		"MaxConnectionIdle", "InvalidArgument", "RetryInfo",
		// Envoy's rate limit service and Istio.
		"RateLimitRequest", "RateLimitResponse", "EnvoyFilter",
		// HTTP headers: Host, and the RateLimit of
		// draft-ietf-httpapi-ratelimit-headers.
		"Host", "RateLimit",
		// Proper nouns, abbreviations and units, cited as Envoy's.
		"API", "Debian", "Envoy", "GitHub", "Go", "KiB", "OpenAI", "OpenTelemetry", "URL",
	)
	// extensions are the file name extensions of README.md and the like,
	// which are not Type.Member.
	extensions = setOf("go", "lua", "md", "mod", "sum", "json", "yaml", "yml", "png", "sh", "txt")
)

func setOf(names ...string) map[string]bool {
	s := make(map[string]bool, len(names))
	for _, n := range names {
		s[n] = true
	}
	return s
}

var (
	// possRe matches pkg's Name, which cites pkg.Name.
	possRe = regexp.MustCompile(`([a-z][a-z0-9]*)'s ([A-Z][A-Za-z0-9_]*(?:\.[A-Z][A-Za-z0-9_]*)?)`)
	// chainRe matches a dotted citation, a.B or a.B.C, and a call of one.
	chainRe = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+\(?`)
	// callRe matches a call of an exported name, Name(. (A lowercase call
	// in a comment is of a parameter, clock(), or a formula's floor(.)
	callRe = regexp.MustCompile(`[A-Z][A-Za-z0-9_]*\(`)
	// camelRe matches a bare name of two humps or more, WithPartitions:
	// prose has none, so it is an identifier.
	camelRe = regexp.MustCompile(`[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+`)
	// seeRe and ownRe match a name of one hump cited as one: see Step,
	// Step's.
	seeRe = regexp.MustCompile(`\bsee ([A-Z][A-Za-z0-9_]+)`)
	ownRe = regexp.MustCompile(`([A-Z][A-Za-z0-9_]+)'s\b`)
	// declRe matches the end of the text before a name a code line of a
	// comment declares, func Name or type Name: not a citation.
	declRe = regexp.MustCompile(`(?:func|type)\s+(?:\([^)]*\)\s*)?$`)
	// wordRe matches a name of one hump, or more, alone.
	wordRe = regexp.MustCompile(`^[A-Z][a-z0-9][A-Za-z0-9_]*$`)
	// spanRe matches an inline code span of markdown.
	spanRe = regexp.MustCompile("`[^`]+`")
)

// citation is one identifier a comment or page cites.
type citation struct {
	where string // file:line
	text  string // as cited: pkg.Name, Type.Member, Name
	in    *pkg   // the package of the comment, nil for a page
}

// citations returns what text cites. Only a citation not part of a path
// or a longer name counts.
func (m *module) citations(where, text string, in *pkg) []citation {
	var out []citation
	taken := make([]bool, len(text)+1)
	boundary := func(i, j int) bool {
		if i > 0 && (strings.ContainsRune("./-:", rune(text[i-1])) || isWord(text[i-1])) {
			return false
		}
		if text[j-1] == '(' {
			return !declRe.MatchString(text[:i]) // a call's arguments follow
		}
		if j < len(text) && (strings.ContainsRune("/-", rune(text[j])) || isWord(text[j])) {
			return false
		}
		if j+1 < len(text) && text[j] == '.' && isWord(text[j+1]) {
			return false
		}
		return !declRe.MatchString(text[:i])
	}
	cite := func(i, j int, name string) {
		if taken[i] || !boundary(i, j) {
			return
		}
		for k := i; k < j; k++ {
			taken[k] = true
		}
		out = append(out, citation{where: where, text: name, in: in})
	}
	for _, loc := range possRe.FindAllStringSubmatchIndex(text, -1) {
		// Of the packages a user imports only: "the server's TIME" is
		// prose.
		if pkg := text[loc[2]:loc[3]]; m.public(pkg) {
			cite(loc[0], loc[1], pkg+"'s "+text[loc[4]:loc[5]])
		}
	}
	for _, re := range []*regexp.Regexp{chainRe, callRe, camelRe} {
		for _, loc := range re.FindAllStringIndex(text, -1) {
			cite(loc[0], loc[1], strings.TrimSuffix(text[loc[0]:loc[1]], "("))
		}
	}
	for _, re := range []*regexp.Regexp{seeRe, ownRe} {
		for _, loc := range re.FindAllStringSubmatchIndex(text, -1) {
			cite(loc[2], loc[3], text[loc[2]:loc[3]])
		}
	}
	return out
}

func isWord(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// resolve reports whether c names something the module declares, or a
// name of another module that externalPackages or externalNames lists.
func (m *module) resolve(c citation) bool {
	text, possessive := c.text, false
	if pkg, name, ok := strings.Cut(text, "'s "); ok {
		text, possessive = pkg+"."+name, true
	}
	segs := strings.Split(text, ".")
	first := segs[0]
	if externalNames[first] {
		return true
	}
	// Every package, the comment's own first.
	var all []*pkg
	if c.in != nil {
		all = append(all, c.in)
	}
	for _, d := range sortedDirs(m) {
		all = append(all, m.byDir[d])
	}
	switch {
	case len(segs) == 1:
		// Name. A test, benchmark or example may be cited by its name's
		// rest, as go test -run and -bench take it.
		distinctive := camelRe.FindString(first) == first
		for _, name := range []string{first, "Test" + first, "Benchmark" + first, "Example" + first} {
			for _, p := range all {
				if p.decls[name] {
					return true
				}
				// A method or field by its name alone: of the comment's
				// own package; of any when the name has two humps or more
				// (RetryAfter), or the citation is a page's.
				if (p == c.in || c.in == nil || distinctive) && anyMember(p, name) {
					return true
				}
			}
		}
		return false
	case unicode.IsLower(rune(first[0])):
		// pkg.Name or pkg.Name.Member; pkg's Name may be a method, as in
		// "redisstore's Refund".
		ps := m.byName[first]
		switch {
		case externalPackages[first]:
			return true
		case len(ps) == 0 && unicode.IsUpper(rune(segs[1][0])):
			// A variable's member, r.Cost: a field or method of some
			// type of the module, or of another module's when listed.
			return externalNames[segs[1]] || m.anyPkgMember(segs[1])
		case len(ps) == 0 || !unicode.IsUpper(rune(segs[1][0])):
			return true // a file, doc.go, or an unexported member
		}
		for _, p := range ps {
			if m.resolveIn(p, segs[1:]) || possessive && len(segs) == 2 && anyMember(p, segs[1]) {
				return true
			}
		}
		return false
	case len(segs) == 2 && extensions[segs[1]]:
		return true // README.md
	default:
		// Type.Member, of the comment's package or any.
		for _, p := range all {
			if p.types[first] && m.resolveIn(p, segs) {
				return true
			}
		}
		return false
	}
}

// public reports whether name is the name of a package of the module
// outside internal/.
func (m *module) public(name string) bool {
	for _, p := range m.byName[name] {
		if p.dir != "internal" && !strings.HasPrefix(filepath.ToSlash(p.dir), "internal/") {
			return true
		}
	}
	return false
}

// anyPkgMember reports whether a type of any package of the module has a
// field or method name.
func (m *module) anyPkgMember(name string) bool {
	for _, p := range m.byDir {
		if anyMember(p, name) {
			return true
		}
	}
	return false
}

// anyMember reports whether a type of p has a field or method name.
func anyMember(p *pkg, name string) bool {
	for _, ms := range p.members {
		if ms[name] {
			return true
		}
	}
	return false
}

// resolveIn reports whether segs, Name or Type.Member, exist in p.
func (m *module) resolveIn(p *pkg, segs []string) bool {
	if !p.decls[segs[0]] {
		return false
	}
	if len(segs) == 1 || !p.types[segs[0]] {
		return true // a member of a var or func is not followed
	}
	return m.hasMember(p, segs[0], segs[1], 0)
}

func sortedDirs(m *module) []string {
	dirs := make([]string, 0, len(m.byDir))
	for d := range m.byDir {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	return dirs
}

// commentCitations returns what the comments of the module's non-test Go
// files cite, the bench module's excepted (its own module, with its own
// names).
func commentCitations(t *testing.T, m *module) []citation {
	t.Helper()
	var out []citation
	fset := token.NewFileSet()
	for _, dir := range sortedDirs(m) {
		if dir == "bench" || strings.HasPrefix(dir, "bench"+string(filepath.Separator)) {
			continue
		}
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(root, path)
			for _, cg := range f.Comments {
				for _, c := range cg.List {
					line := fset.Position(c.Slash).Line
					for k, l := range strings.Split(c.Text, "\n") {
						if strings.HasPrefix(l, "//go:") || strings.HasPrefix(l, "//line ") {
							continue
						}
						where := filepath.ToSlash(rel) + ":" + strconv.Itoa(line+k)
						out = append(out, m.citations(where, l, m.byDir[dir])...)
					}
				}
			}
		}
	}
	return out
}

// pageCitations returns what the inline code spans of README.md and
// docs/*.md cite, outside fenced blocks (snippets_test compiles those).
func pageCitations(t *testing.T, m *module) []citation {
	t.Helper()
	var out []citation
	for _, file := range docFiles(t) {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		fenced := false
		for i, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "```") {
				fenced = !fenced
				continue
			}
			if fenced {
				continue
			}
			where := file + ":" + strconv.Itoa(i+1)
			for _, span := range spanRe.FindAllString(l, -1) {
				span = strings.Trim(span, "`")
				if wordRe.MatchString(span) {
					// A span of one exported name, `Store`, cites it.
					out = append(out, citation{where: where, text: span})
					continue
				}
				out = append(out, m.citations(where, span, nil)...)
			}
		}
	}
	return out
}

// TestCitedIdentifiersExist checks that every Go identifier the module's
// words cite exists: the comments of its non-test Go files (the bench
// module's excepted), and the inline code spans of README.md and
// docs/*.md. A citation is pkg.Name or pkg.Name.Member, of that package
// of the module, or pkg's Name, which may also be a method; Type.Member,
// of the comment's package or any of the module's; Name( and, in a
// comment, see Name and Name's, declared in the comment's package or at
// the top level of any; a bare name of two humps or more, WithPartitions,
// and a span of one name, `Store`, declared anywhere in the module. A
// name of another module is skipped only when externalPackages or
// externalNames lists it. Prose is not read: a stale name cited as plain
// text ("made with Step") is not found.
func TestCitedIdentifiersExist(t *testing.T) {
	m := loadModule(t)
	inComments := commentCitations(t, m)
	inPages := pageCitations(t, m)
	stale := 0
	for _, c := range append(inComments, inPages...) {
		if !m.resolve(c) {
			t.Errorf("%s: %s names nothing the module declares", c.where, c.text)
			stale++
		}
	}
	t.Logf("%d citations in comments, %d in pages; %d stale", len(inComments), len(inPages), stale)
}
