package service

import (
	"fmt"
	"os"
	"strings"
)

// A ConfigError is an error of Start caused by a Config that cannot be
// served, whatever the machine: a setting the command line should not
// have given. Errors name settings as serve's flags do.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }

// Unwrap returns the error.
func (e *ConfigError) Unwrap() error { return e.Err }

func configErrorf(format string, args ...any) error {
	return &ConfigError{fmt.Errorf(format, args...)}
}

// ReadTokenFile returns the bearer token in the file at path: one word,
// surrounding space trimmed. setting names the file in the errors (the
// flag, "--token-file").
func ReadTokenFile(setting, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", setting, err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("%s %s is empty", setting, path)
	}
	if strings.ContainsAny(t, " \t\r\n") {
		return "", fmt.Errorf("%s %s: the token must be one word", setting, path)
	}
	return t, nil
}
