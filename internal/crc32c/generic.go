//go:build !(isal && cgo)

package crc32c

import "hash/crc32"

const (
	accelerated    = false
	implementation = "go"
)

// accelUpdate is hash/crc32 in a build without ISA-L (Update does not call it: accelerated
// is false).
func accelUpdate(crc uint32, p []byte) uint32 { return crc32.Update(crc, table, p) }
