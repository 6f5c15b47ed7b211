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

// field is a top-level field of a request body: its name, exactly as it
// must be spelled, and where its value is decoded to.
type field struct {
	name string
	dst  any
}

// fieldList writes the names of fields as a list in words: "namespace,
// subject and cost".
func fieldList(fields []field) string {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.name
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// readBody reads a request body of at most MaxBodyBytes, or returns the
// status and message of why it cannot. The body must be valid UTF-8: JSON
// decoding turns every invalid byte into U+FFFD, and two subjects would
// share a bucket.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, int, string) {
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
	return data, 0, ""
}

// decodeBody reads the body and decodes it, in one pass, into fields: a
// JSON object (or null, which sets nothing) whose every name is one of
// fields, spelled exactly (encoding/json would match "Subject" or
// "SUBJECT" too) and given once (encoding/json keeps the last), followed by
// nothing. It returns the status and message of why it cannot, or 0. Each
// call is counted in s.decodes.
func (s *Service) decodeBody(w http.ResponseWriter, r *http.Request, fields ...field) (code int, msg string) {
	s.decodes.Add(1)
	data, code, msg := readBody(w, r)
	if code != 0 {
		return code, msg
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	switch {
	case errors.Is(err, io.EOF):
		return http.StatusBadRequest, fmt.Sprintf("empty body; send a JSON object of %s", fieldList(fields))
	case err != nil:
		return syntaxError(err, data)
	case tok == nil: // null: no field
	case tok != json.Delim('{'):
		if code, msg := malformed(data); code != 0 {
			return code, msg
		}
		return http.StatusBadRequest, fmt.Sprintf("the body must be a JSON object, not %s", jsonValueKind(tok))
	default:
		if code, msg := decodeFields(dec, data, fields); code != 0 {
			return code, msg
		}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return http.StatusBadRequest, "the body must hold one JSON object and nothing after it"
	}
	return 0, ""
}

// decodeFields decodes the members of the object dec, a decoder of data,
// is in, up to its closing brace, into fields. The errors rank as
// encoding/json with a check of the names before it would rank them: a
// name that is not one of fields, or given twice, first, then a syntax
// error, then a value that does not fit its field (one an Unmarshaler
// refuses before one of the wrong type), whichever comes first in the
// body; the decoding goes on past a value that does not fit, so that
// what outranks it is found.
func decodeFields(dec *json.Decoder, data []byte, fields []field) (code int, msg string) {
	var seen uint64 // a bit per field
	var refused, mistyped string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return syntaxError(err, data)
		}
		name, _ := tok.(string) // More and Token leave a name here
		i := slices.IndexFunc(fields, func(f field) bool { return f.name == name })
		switch {
		case i < 0:
			return http.StatusBadRequest, fmt.Sprintf("unknown field %q (the fields are %s, in lower case)", name, fieldList(fields))
		case seen&(1<<i) != 0:
			return http.StatusBadRequest, fmt.Sprintf("field %q appears twice", name)
		}
		seen |= 1 << i
		err = dec.Decode(fields[i].dst) // past the value, unless it is malformed
		var typ *json.UnmarshalTypeError
		var syn *json.SyntaxError
		switch {
		case err == nil:
		case errors.As(err, &syn), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
			return syntaxError(err, data)
		case errors.As(err, &typ):
			if mistyped == "" {
				mistyped = fmt.Sprintf("field %q must be %s, not %s", name, jsonKind(typ.Type.Kind().String()), typ.Value)
			}
		case refused == "":
			refused = strings.TrimPrefix(err.Error(), "json: ")
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return syntaxError(err, data)
	}
	switch {
	case refused != "":
		return http.StatusBadRequest, refused
	case mistyped != "":
		return http.StatusBadRequest, mistyped
	}
	return 0, ""
}

// syntaxError returns the status and message of err, the decoder's error
// in data, the body: malformed's, or err's own.
func syntaxError(err error, data []byte) (code int, msg string) {
	if code, msg := malformed(data); code != 0 {
		return code, msg
	}
	return http.StatusBadRequest, strings.TrimPrefix(err.Error(), "json: ")
}

// malformed returns the status and message of the syntax error in data's
// first JSON value, or 0 when it is well formed. It scans data again, on
// the path of a bad body only: so that a body both malformed and of the
// wrong shape is told as malformed, whichever comes first in it, and so
// that the message names the byte of the error as encoding/json's scanner
// counts it (the bytes read up to and including it), whichever step of the
// decoder met it.
func malformed(data []byte) (code int, msg string) {
	err := json.NewDecoder(bytes.NewReader(data)).Decode(new(json.RawMessage))
	var syn *json.SyntaxError
	switch {
	case err == nil:
		return 0, ""
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return http.StatusBadRequest, "malformed JSON: the body ends in the middle of a value"
	case errors.As(err, &syn):
		return http.StatusBadRequest, fmt.Sprintf("malformed JSON at byte %d: %s", syn.Offset, strings.TrimPrefix(syn.Error(), "json: "))
	}
	return http.StatusBadRequest, strings.TrimPrefix(err.Error(), "json: ")
}

// jsonValueKind names the kind of a JSON value from its first token.
func jsonValueKind(tok json.Token) string {
	switch tok.(type) {
	case json.Delim:
		return "array"
	case string:
		return "string"
	case bool:
		return "bool"
	}
	return "number"
}

// request checks what every POST of the API needs (begin), decodes the
// body into fields, and checks the subject they decode into (subject, when
// not nil). When one is wrong it answers and returns false.
func (s *Service) request(w http.ResponseWriter, r *http.Request, path string, subject *string, fields ...field) bool {
	if !s.begin(w, r, path) {
		return false
	}
	code, msg := s.decodeBody(w, r, fields...)
	if code == 0 && subject != nil {
		code, msg = checkSubject(*subject)
	}
	if code != 0 {
		s.fail(w, path, code, msg)
		return false
	}
	return true
}

// decode reads an APIRequest, or returns the status and message of why it
// cannot.
func (s *Service) decode(w http.ResponseWriter, r *http.Request) (req APIRequest, code int, msg string) {
	code, msg = s.decodeBody(w, r, req.fields()...)
	if code != 0 {
		return req, code, msg
	}
	code, msg = checkSubject(req.Subject)
	return req, code, msg
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
