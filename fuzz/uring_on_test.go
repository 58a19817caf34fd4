//go:build linux && uring

package fuzz_test

// uringTag says the test binary was built with the uring tag (and so with
// -ldflags=-checklinkname=0): helper binaries it builds get the same flags, and the store
// under test runs on the io_uring backend when the kernel permits it.
const uringTag = true
