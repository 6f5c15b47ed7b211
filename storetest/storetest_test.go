package storetest_test

import (
	"testing"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/storetest"
)

// TestMemstore runs the suite over memstore, as Example shows.
func TestMemstore(t *testing.T) { testSuite(t) }

// plain is a Store with none of the optional capabilities.
type plain struct{ ratelimit.Store }

// TestPlainStore runs the suite over a store of Apply and Reset alone, one
// store for every case: the cases of the capabilities it lacks are skipped.
func TestPlainStore(t *testing.T) {
	store := plain{memstore.New()}
	storetest.Run(t, func(*testing.T) ratelimit.Store { return store })
}
