package envoyrls

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/exactlimit/ratelimit/internal/units"
	"go.yaml.in/yaml/v3"
)

// yamlFile, yamlDescriptor and yamlRateLimit are the peer's format, plus
// burst. Decoding refuses any other field.
type yamlFile struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value"`
	RateLimit      *yamlRateLimit   `yaml:"rate_limit"`
	Descriptors    []yamlDescriptor `yaml:"descriptors"`
	ShadowMode     bool             `yaml:"shadow_mode"`
	DetailedMetric bool             `yaml:"detailed_metric"`
	ValueToMetric  bool             `yaml:"value_to_metric"`
	ShareThreshold bool             `yaml:"share_threshold"`
	// QuotaMode is kept on the rule, which is decided as any other
	// (see Rule.QuotaMode).
	QuotaMode bool `yaml:"quota_mode"`
	// Metadata goes into the response's dynamic metadata when the rule's
	// descriptor passes (Options.DynamicMetadata).
	Metadata map[string]any `yaml:"metadata"`
}

type yamlRateLimit struct {
	Unit            string         `yaml:"unit"`
	RequestsPerUnit *wholeUint32   `yaml:"requests_per_unit"`
	Unlimited       bool           `yaml:"unlimited"`
	Name            string         `yaml:"name"`
	Replaces        []yamlReplaces `yaml:"replaces"`
	// Burst is this service's extension: the bucket's capacity.
	Burst *int64 `yaml:"burst"`
}

type yamlReplaces struct {
	Name string `yaml:"name"`
}

// LoadOptions say how LoadConfig reads a directory, as the peer's
// RUNTIME_IGNOREDOTFILES and MERGE_DOMAIN_CONFIG settings do.
type LoadOptions struct {
	// IgnoreDotFiles leaves out files and directories whose name starts
	// with a dot. Directories whose name starts with ".." (Kubernetes'
	// ..data and its timestamped directories) are always left out: their
	// files are the ones the directory's own symbolic links point to.
	IgnoreDotFiles bool
	// MergeDomains lets several files configure one domain: their
	// descriptors are loaded into one tree (a descriptor written twice is
	// still an error). Without it a domain in two files is an error.
	MergeDomains bool
}

// LoadConfig reads the configuration at path with the default LoadOptions
// (see LoadOptions.Load).
func LoadConfig(path string) (*Config, error) { return LoadOptions{}.Load(path) }

// Load reads the configuration at path: one YAML file, or a directory whose
// every regular file, in subdirectories too (as the peer's runtime loader
// reads them), holds one domain; a symbolic link to a file is read, one to
// a directory is not followed. Every error wraps ErrConfig and names the
// file and the reason; nothing of a configuration with an error is used.
func (o LoadOptions) Load(path string) (*Config, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	files := []string{path}
	if fi.IsDir() {
		if files, err = o.list(path); err != nil {
			return nil, err
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%w: %s: no files in the directory", ErrConfig, path)
		}
	}
	srcs := make(map[string][]byte, len(files))
	for _, f := range files {
		data, err := readFile(f)
		if err != nil {
			return nil, err
		}
		srcs[f] = data
	}
	return compile(files, srcs, o.MergeDomains)
}

// list returns the files of directory root that Load reads, in lexical
// order of their paths.
func (o LoadOptions) list(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
		name := d.Name()
		dot := path != root && strings.HasPrefix(name, ".")
		switch {
		case d.IsDir() && dot && (o.IgnoreDotFiles || strings.HasPrefix(name, "..")):
			return filepath.SkipDir
		case d.IsDir() || (dot && o.IgnoreDotFiles):
			return nil
		case d.Type()&fs.ModeSymlink != 0:
			fi, err := os.Stat(path)
			if err != nil {
				return fmt.Errorf("%w: %v", ErrConfig, err)
			}
			if !fi.Mode().IsRegular() {
				return nil // a link to a directory is not followed
			}
		case !d.Type().IsRegular():
			return nil
		}
		files = append(files, path)
		return nil
	})
	return files, err
}

// ParseConfig compiles one file's content; name appears in its errors.
func ParseConfig(name string, data []byte) (*Config, error) {
	return compile([]string{name}, map[string][]byte{name: data}, false)
}

func readFile(path string) ([]byte, error) {
	data, err := units.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return data, nil
}

func compile(files []string, srcs map[string][]byte, merge bool) (*Config, error) {
	c := &Config{domains: map[string]*node{}}
	owner := map[string]string{}
	for _, name := range files {
		y, err := decode(srcs[name])
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrConfig, name, err)
		}
		if y.Domain == "" {
			return nil, fmt.Errorf("%w: %s: the domain must not be empty", ErrConfig, name)
		}
		root := &node{}
		if prev, dup := owner[y.Domain]; dup {
			if !merge {
				return nil, fmt.Errorf("%w: %s: domain %q is also in %s (one file per domain, or set MERGE_DOMAIN_CONFIG=true)", ErrConfig, name, y.Domain, prev)
			}
			root = c.domains[y.Domain]
		}
		owner[y.Domain] = name
		b := builder{domain: y.Domain, c: c}
		if err := b.load(root, y.Descriptors, nil, 1); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrConfig, name, err)
		}
		c.domains[y.Domain] = root
	}
	return c, nil
}

// decode reads one YAML document strictly: unknown fields and a second
// document are errors.
func decode(data []byte) (yamlFile, error) {
	var y yamlFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&y); err != nil {
		if errors.Is(err, io.EOF) {
			return y, errors.New("the file is empty")
		}
		return y, errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return y, errors.New("the file holds more than one YAML document")
	}
	return y, nil
}

// wholeUint32 is requests_per_unit: a YAML integer from 0 to 2^32-1. A
// number with a fraction (5.5) is refused, as the peer refuses it, where a
// plain uint32 field would take its integer part.
type wholeUint32 uint32

func (w *wholeUint32) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		return fmt.Errorf("line %d: requests_per_unit must be a whole number from 0 to 4294967295 (got %q)", n.Line, n.Value)
	}
	var u uint32
	if err := n.Decode(&u); err != nil {
		return err
	}
	*w = wholeUint32(u)
	return nil
}
