//go:build isal && cgo

package crc32c

/*
#cgo LDFLAGS: -lisal
#include <isa-l/crc.h>
*/
import "C"

import "unsafe"

const (
	accelerated    = true
	implementation = "isa-l"
)

// accelUpdate is Update over ISA-L's crc32_iscsi, which takes and returns the CRC register
// without Go's pre- and post-inversion. len(p) is between 1 and accelChunkBytes.
func accelUpdate(crc uint32, p []byte) uint32 {
	return ^uint32(C.crc32_iscsi((*C.uchar)(unsafe.Pointer(unsafe.SliceData(p))), C.int(len(p)), C.uint(^crc)))
}
