package tokenbucket_test

import (
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

func ExampleBucket() {
	b, _ := tokenbucket.New(ratelimit.PerSecond(2))
	start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	fmt.Println(b.Allow(start), b.Allow(start), b.Allow(start))
	fmt.Println(b.Allow(start.Add(500 * time.Millisecond)))
	// Output:
	// true true false
	// true
}
