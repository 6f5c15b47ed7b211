package server

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/exactlimit/ratelimit/internal/keyfmt"
)

// maxLoggedError bounds an error message in a log line.
const maxLoggedError = 300

// RedactKeys returns msg with every quoted bucket key in it (a Go-quoted
// "LEN:NAMESPACE:SUBJECT", as the stores' errors quote keys) replaced by the
// namespace and the subject's keyfmt.Hash, and cut to a few hundred bytes,
// for the log.
func RedactKeys(msg string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(msg, '"')
		if i < 0 {
			b.WriteString(msg)
			break
		}
		b.WriteString(msg[:i])
		q, err := strconv.QuotedPrefix(msg[i:])
		if err != nil {
			// An unterminated quote: it may be a key cut short.
			b.WriteString(`"…`)
			break
		}
		msg = msg[i+len(q):]
		key, _ := strconv.Unquote(q)
		if ns, subject, ok := keyfmt.Parse(key); ok {
			b.WriteString(strconv.Quote(ns + ":" + keyfmt.Hash(subject)))
			continue
		}
		b.WriteString(q)
	}
	out := b.String()
	if len(out) > maxLoggedError {
		cut := maxLoggedError
		for cut > 0 && !utf8.RuneStart(out[cut]) {
			cut--
		}
		out = out[:cut] + "…"
	}
	return out
}

// redactErr returns err's message for the log, with key (subject's key
// in namespace ns) and any quoted key replaced by the namespace and the
// subject's hash.
func redactErr(err error, key, ns, subject string) string {
	msg := RedactKeys(err.Error())
	if key != "" {
		msg = strings.ReplaceAll(msg, key, ns+":"+keyfmt.Hash(subject))
	}
	return msg
}
