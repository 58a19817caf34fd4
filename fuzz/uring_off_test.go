//go:build !(linux && uring)

package fuzz_test

// uringTag says the test binary was built with the uring tag; see uring_on_test.go.
const uringTag = false
