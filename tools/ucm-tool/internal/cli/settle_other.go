//go:build !linux

package cli

// settleFS is a no-op where syncfs is not available.
func settleFS(string) {}
