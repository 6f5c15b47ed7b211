package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"
)

// MaxBodyBytes bounds the body of an API request.
const MaxBodyBytes = 64 << 10

// MaxSubjectBytes bounds a subject.
const MaxSubjectBytes = 1024

// isJSON reports whether the request's Content-Type is application/json,
// with or without parameters. Requiring it keeps a web page from making a
// browser post to the API (a form or a text/plain fetch needs no preflight;
// application/json does).
func isJSON(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == "application/json"
}

// apiFields are the field names of APIRequest, exactly as they must be
// spelled.
var apiFields = []string{"namespace", "subject", "cost"}

// fieldList writes fields as a list in words: "namespace, subject and cost".
func fieldList(fields []string) string {
	if len(fields) < 2 {
		return strings.Join(fields, "")
	}
	return strings.Join(fields[:len(fields)-1], ", ") + " and " + fields[len(fields)-1]
}

// strictFields checks a JSON object's top-level field names: each must be
// one of fields, spelled exactly (encoding/json would match "Subject" or
// "SUBJECT" too), and none may appear twice (encoding/json keeps the
// last). It returns nil for input that is not an object: the decoder
// reports that.
func strictFields(data []byte, fields []string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		name, ok := tok.(string)
		if !ok {
			return nil
		}
		switch {
		case seen[name]:
			return fmt.Errorf("field %q appears twice", name)
		case !slices.Contains(fields, name):
			return fmt.Errorf("unknown field %q (the fields are %s, in lower case)", name, fieldList(fields))
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

// readBody reads a request body of at most MaxBodyBytes, holding the top-level
// fields named in fields at most, or returns the status and message of why
// it cannot. The body must be valid UTF-8: JSON
// decoding turns every invalid byte into U+FFFD, and two subjects would
// share a bucket.
func readBody(w http.ResponseWriter, r *http.Request, fields []string) ([]byte, int, string) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", mbe.Limit)
	case err != nil:
		return nil, http.StatusBadRequest, "could not read the body"
	case !utf8.Valid(data):
		return nil, http.StatusBadRequest, "the body is not valid UTF-8"
	}
	if err := strictFields(data, fields); err != nil {
		return nil, http.StatusBadRequest, err.Error()
	}
	return data, 0, ""
}

// decode reads an APIRequest, or returns the status and message of why it
// cannot.
func (s *Service) decode(w http.ResponseWriter, r *http.Request) (req APIRequest, code int, msg string) {
	if code, msg = decodeBody(w, r, &req, apiFields); code != 0 {
		return req, code, msg
	}
	code, msg = checkSubject(req.Subject)
	return req, code, msg
}

// decodeBody reads the body into v, a pointer to a struct of the fields
// named in fields, or returns the status and message of why it cannot.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, fields []string) (code int, msg string) {
	data, code, msg := readBody(w, r, fields)
	if code != 0 {
		return code, msg
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, err2 := dec.Token(); !errors.Is(err2, io.EOF) {
			var mbe *http.MaxBytesError
			if errors.As(err2, &mbe) {
				err = err2
			} else {
				return http.StatusBadRequest, "the body must hold one JSON object and nothing after it"
			}
		}
	}
	if err != nil {
		var mbe *http.MaxBytesError
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &mbe):
			return http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", mbe.Limit)
		case errors.Is(err, io.EOF):
			return http.StatusBadRequest, fmt.Sprintf("empty body; send a JSON object of %s", fieldList(fields))
		case errors.Is(err, io.ErrUnexpectedEOF):
			return http.StatusBadRequest, "malformed JSON: the body ends in the middle of a value"
		case errors.As(err, &syn):
			return http.StatusBadRequest, fmt.Sprintf("malformed JSON at byte %d: %s", syn.Offset, strings.TrimPrefix(syn.Error(), "json: "))
		case errors.As(err, &typ):
			if typ.Field == "" {
				return http.StatusBadRequest, fmt.Sprintf("the body must be a JSON object, not %s", typ.Value)
			}
			return http.StatusBadRequest, fmt.Sprintf("field %q must be %s, not %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value)
		default:
			return http.StatusBadRequest, strings.TrimPrefix(err.Error(), "json: ")
		}
	}
	return 0, ""
}

// checkSubject returns the status and message of why subject cannot name a
// bucket, or 0.
func checkSubject(subject string) (code int, msg string) {
	switch {
	case subject == "":
		return http.StatusBadRequest, `subject is required, e.g. {"subject": "alice"}`
	case len(subject) > MaxSubjectBytes:
		return http.StatusBadRequest, fmt.Sprintf("subject is longer than %d bytes", MaxSubjectBytes)
	case strings.ContainsRune(subject, utf8.RuneError):
		// Lone surrogate escapes ("\ud800") decode to U+FFFD as invalid
		// bytes do: refused, so that no two subjects share a bucket.
		return http.StatusBadRequest, "subject holds U+FFFD or a lone surrogate escape; send valid UTF-8"
	}
	return 0, ""
}

func jsonKind(k string) string {
	switch k {
	case "int64":
		return "a whole number"
	case "string":
		return "a string"
	}
	return k
}
