package units

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for name, want := range map[string]time.Duration{"second": time.Second, "Minute": time.Minute, "DAY": 24 * time.Hour, "week": 168 * time.Hour, "month": 720 * time.Hour, "year": 8760 * time.Hour} {
		if d, ok := Parse(name); !ok || d != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", name, d, ok, want)
		}
	}
	if _, ok := Parse("fortnight"); ok {
		t.Error("Parse accepted an unknown unit")
	}
}

func TestReadFileIsBounded(t *testing.T) {
	dir := t.TempDir()
	small, big := filepath.Join(dir, "small.yaml"), filepath.Join(dir, "big.yaml")
	os.WriteFile(small, []byte("a: 1\n"), 0o600)
	os.WriteFile(big, make([]byte, MaxFileSize+1), 0o600)
	if data, err := ReadFile(small); err != nil || string(data) != "a: 1\n" {
		t.Fatalf("ReadFile(small) = %q, %v", data, err)
	}
	if _, err := ReadFile(big); err == nil || !strings.Contains(err.Error(), big) {
		t.Fatalf("ReadFile(big) = %v, want an error naming the file", err)
	}
}

func TestFormat(t *testing.T) {
	for d, want := range map[time.Duration]string{time.Minute: "1m", time.Hour: "1h", 90 * time.Minute: "1h30m", 90 * time.Second: "1m30s", 250 * time.Millisecond: "250ms", 8760 * time.Hour: "8760h"} {
		got := Format(d)
		if back, err := time.ParseDuration(got); got != want || err != nil || back != d {
			t.Errorf("Format(%v) = %q (reads back as %v, %v), want %q", d, got, back, err, want)
		}
	}
}
