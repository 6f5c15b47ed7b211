package storetest_test

import (
	"testing"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/storetest"
)

// testSuite is the test a store's package holds, there named TestSuite: it
// runs the suite over the store, here memstore, with a new store for each
// case. A store over a server would start the server once, before Run, and
// return a store on it from the function, closing it with t.Cleanup.
// (TestMemstore calls it, so that go test runs it.)
func testSuite(t *testing.T) {
	storetest.Run(t, func(t *testing.T) ratelimit.Store {
		return memstore.New()
	})
}

// A store's package runs the suite from one of its tests, testSuite above,
// which passes Run a function that returns the store.
func Example() {}
