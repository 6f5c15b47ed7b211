// Package units is what the two YAML config dialects of the ratelimit
// command share (the namespaces of internal/config and envoyproxy/ratelimit's
// of internal/envoyrls): the names of a rate's unit and the bounded read of a
// config file.
package units

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Durations maps each unit name to its length, as envoyproxy/ratelimit
// defines them: a month is 30 days and a year 365 days.
var Durations = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// Names lists the unit names for an error message.
const Names = "second, minute, hour, day, week, month or year"

// Parse returns the length of the unit called name, in any case.
func Parse(name string) (time.Duration, bool) {
	d, ok := Durations[strings.ToLower(name)]
	return d, ok
}

// MaxFileSize bounds one config file.
const MaxFileSize = 4 << 20

// ReadFile reads the config file at path, refusing one larger than
// MaxFileSize. The error names the path.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, MaxFileSize)
	}
	return data, nil
}

// Format writes d as time.Duration does, without trailing zero minutes and
// seconds: "1m", "1h", "1h30m", and "1m30s" as it is. time.ParseDuration
// reads every result back.
func Format(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
