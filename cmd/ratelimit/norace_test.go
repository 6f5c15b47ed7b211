//go:build !race

package main_test

var buildFlags []string
