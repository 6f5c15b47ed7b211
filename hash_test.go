package ratelimit_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/grpclimit"
	"github.com/exactlimit/ratelimit/httplimit"
	"google.golang.org/grpc/metadata"
)

// TestHashSubjectIsTheMiddlewaresKey: HashSubject gives the key httplimit's
// Header and grpclimit's Metadata give the same credential, so a limiter
// keyed by either shares its buckets with one keyed by HashSubject, and it
// holds nothing of the credential.
func TestHashSubjectIsTheMiddlewaresKey(t *testing.T) {
	header, meta := httplimit.Header("X-API-Key"), grpclimit.Metadata("x-api-key")
	for _, tc := range []struct{ credential, want string }{
		{"k1", "sha256:arnx6499M4j0-dWG9m6Z_Q"},
		{"sk-live-7Hq2Zx9LmP4vRt8Kw3Ny", ""},
		{strings.Repeat("x", 1000), ""},
	} {
		got := ratelimit.HashSubject(tc.credential)
		if tc.want != "" && got != tc.want || len(got) != 29 || strings.Contains(got, tc.credential) {
			t.Errorf("HashSubject(%.20q) = %q, want %q", tc.credential, got, tc.want)
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-API-Key", tc.credential)
		if k, err := header(r); err != nil || k != got {
			t.Errorf("httplimit.Header of %.20q = %q, %v; HashSubject gives %q", tc.credential, k, err, got)
		}
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", tc.credential))
		if k, err := meta(ctx, "/m"); err != nil || k != got {
			t.Errorf("grpclimit.Metadata of %.20q = %q, %v; HashSubject gives %q", tc.credential, k, err, got)
		}
	}
}
