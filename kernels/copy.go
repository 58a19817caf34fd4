package kernels

// streamMinRun is the shortest run copyStream writes around the caches; shorter runs (a TP
// slice's per-token heads, per-element strides) are plain copies, since non-temporal stores
// of short runs cannot fill whole write-combining buffers.
const streamMinRun = 2048

// streamMinOp is the size from which a gather or scatter uses copyStream for its runs: as
// runtime·memmove, which writes copies of 1 MiB or more around the caches; smaller operations
// leave their bytes in cache for whoever reads them next.
const streamMinOp = 1 << 20
