//go:build !linux

package cli

// settleFS is a no-op where syncfs is not available.
func settleFS(string) {}

// inflightReader finds no device queue where there is no /sys/dev/block.
func inflightReader(string) (read func() (int, bool), closeFn func(), name string) {
	return nil, nil, ""
}
