package envoyrls_test

import (
	"context"
	"fmt"
	"log"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/exactlimit/ratelimit/internal/envoyrls"
	"github.com/exactlimit/ratelimit/memstore"
)

// A config in envoyproxy/ratelimit's format, decided with token buckets:
// two messages a day per number, all or nothing across the descriptors.
func Example() {
	cfg, err := envoyrls.ParseConfig("messaging.yaml", []byte(`
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 2}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`))
	if err != nil {
		log.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	svc, err := envoyrls.New(envoyrls.Options{Store: memstore.New(), Config: cfg, Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	entry := func(k, v string) *rlv3.RateLimitDescriptor_Entry {
		return &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	req := &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{entry("message_type", "marketing"), entry("to_number", "2061111111")}},
		{Entries: []*rlv3.RateLimitDescriptor_Entry{entry("to_number", "2061111111")}},
	}}
	for range 3 {
		resp, err := svc.ShouldRateLimit(context.Background(), req)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.OverallCode, resp.Statuses[0].LimitRemaining, resp.Statuses[1].LimitRemaining)
	}
	// Output:
	// OK 1 99
	// OK 0 98
	// OVER_LIMIT 0 97
}
