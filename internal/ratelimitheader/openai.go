package ratelimitheader

import (
	"net/http"
	"strconv"
	"time"
)

// SetOpenAI sets on h the rate-limit headers OpenAI's API sends, from the
// standing of a policy's two limits, requests then tokens:
// x-ratelimit-limit-requests and -tokens (each Standing.Limit),
// x-ratelimit-remaining-requests and -tokens (each Remaining, 0 while in
// debt), and x-ratelimit-reset-requests and -tokens (each ResetAfter,
// rounded up to the millisecond and written as OpenAI writes it, in Go's
// duration format: "12ms", "1s", "6m0s"). The Names are not sent.
func SetOpenAI(h http.Header, requests, tokens Standing) {
	for _, s := range [2]struct {
		name string
		Standing
	}{{"Requests", requests}, {"Tokens", tokens}} {
		h.Set("X-Ratelimit-Limit-"+s.name, strconv.FormatInt(s.Limit, 10))
		h.Set("X-Ratelimit-Remaining-"+s.name, strconv.FormatInt(max(s.Remaining, 0), 10))
		h.Set("X-Ratelimit-Reset-"+s.name, openAIDuration(s.ResetAfter))
	}
}

// openAIDuration writes d as OpenAI's reset headers do: rounded up to the
// millisecond, in Go's duration format.
func openAIDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return ((d + time.Millisecond - 1) / time.Millisecond * time.Millisecond).String()
}
