//go:build !linux

package cli

// populateLargest does nothing off Linux (Mooncake runs on Linux only): the holder's pages
// are faulted in by the transfers that first land on them.
func populateLargest(int64) error { return nil }
