// Package testkit holds small helpers shared by the module's tests: a
// goroutine-safe log sink and the like. It has no test logic of its own;
// the behaviour suite every store must pass is in internal/storetest, and
// real Redis servers come from internal/redistest.
package testkit

import (
	"bytes"
	"sync"
)

// Buffer is a goroutine-safe bytes.Buffer for what a logger or a command
// writes while the test reads it. The zero value is an empty buffer ready
// to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
