//go:build !linux

package cli

// settleFS is a no-op where syncfs is not available.
func settleFS(string) {}

// inflightReader finds no device queue where there is no /sys/dev/block.
func inflightReader(string) (read func() (int, bool), closeFn func(), name string) {
	return nil, nil, ""
}

// blockStatReader finds no device counters where there is no /sys/dev/block.
func blockStatReader(string) (read func() (blockCounters, bool), name string) { return nil, "" }
