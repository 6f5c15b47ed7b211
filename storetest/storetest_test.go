package storetest_test

import "testing"

// TestMemstore runs the suite over memstore, as Example shows.
func TestMemstore(t *testing.T) { testSuite(t) }
