// Package memcopy copies large buffers the way runtime·memmove copies one of 1 MiB or more:
// with non-temporal stores, which write around the caches instead of reading every destination
// line first (amd64 with AVX2; a plain copy elsewhere). The staging layer's transfers use it for
// their runs, the mooncake tier for its checked copy out of staging, so that many shorter
// copies of one large operation move their bytes as one large copy would.
package memcopy

// MinRun is the shortest copy Stream writes around the caches; shorter ones (a TP slice's
// per-token heads, per-element strides) are plain copies, since non-temporal stores of short
// runs cannot fill whole write-combining buffers.
const MinRun = 2048

// MinOp is the size of an operation (the bytes of all its copies) from which callers copy
// with Stream: as runtime·memmove, which writes copies of 1 MiB or more around the caches.
// Smaller operations leave their bytes in cache for whoever reads them next.
const MinOp = 1 << 20
