package ratelimit

// Outage names what a check does when its store cannot be reached: the four
// behaviours users choose between. Package fallback implements them as a
// Store wrapper, and package httplimit reuses the names for its responses.
type Outage uint8

const (
	// ReturnError returns the store's error: the caller decides whether an
	// outage should admit the request or reject it. It is the default.
	ReturnError Outage = iota
	// FailOpen admits the request without a check (availability first). The
	// Decision's Source is SourceFailOpen, so it is not Enforced.
	FailOpen
	// FailClosed denies the request without a check (protection first). The
	// Decision's Source is SourceFailClosed.
	FailClosed
	// LocalFallback keeps limiting from a process-local bucket per subject,
	// with the same policy and arithmetic, until the store answers again. The
	// Decision's Source is SourceLocal.
	LocalFallback
)

// String returns the behaviour's name: "return-error", "fail-open",
// "fail-closed" or "local-fallback".
func (o Outage) String() string {
	switch o {
	case ReturnError:
		return "return-error"
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	case LocalFallback:
		return "local-fallback"
	}
	return "unknown"
}
