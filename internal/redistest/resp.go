package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// respError is an error reply ("-ERR ...") from the server.
type respError string

func (e respError) Error() string { return string(e) }

// do sends one command to addr on a fresh connection and returns the decoded
// RESP2 reply: string for simple and bulk strings, int64 for integers, nil
// for null replies, []any for arrays, and a respError for error replies.
// The whole exchange is bounded by timeout. It exists so that the harness
// itself does not depend on client library behaviour it is meant to test.
func do(addr string, timeout time.Duration, args ...string) (any, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return nil, err
	}
	v, err := readReply(bufio.NewReader(conn))
	if err != nil {
		return nil, err
	}
	if e, ok := v.(respError); ok {
		return nil, e
	}
	return v, nil
}

// doString is do for commands whose reply is a (bulk or simple) string.
func doString(addr string, timeout time.Duration, args ...string) (string, error) {
	v, err := do(addr, timeout, args...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: unexpected reply %T to %q", addr, v, args)
	}
	return s, nil
}

func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return "", fmt.Errorf("malformed RESP line %q", line)
	}
	return line[:len(line)-2], nil
}

func readReply(r *bufio.Reader) (any, error) {
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	payload := line[1:]
	switch line[0] {
	case '+':
		return payload, nil
	case '-':
		return respError(payload), nil
	case ':':
		return strconv.ParseInt(payload, 10, 64)
	case '$':
		n, err := strconv.Atoi(payload)
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(payload)
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, nil
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return out, nil
	default:
		return nil, errors.New("unsupported RESP type " + strconv.Quote(line[:1]))
	}
}

// infoField returns the value of field in the text of an INFO or CLUSTER
// INFO reply, or "" when it is absent.
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == field {
			return v
		}
	}
	return ""
}
