// Package devio is UCM-Go's block I/O layer: aligned buffers, O_DIRECT with a
// buffered fallback, and two interchangeable I/O backends (io_uring and a
// portable pread/pwrite worker pool) behind the Backend interface.
//
// All files are opened through Pebble's vfs.FS seam, so the whole engine can
// run on vfs.NewCrashableMem() in tests. Files without a kernel file
// descriptor (Fd() == vfs.InvalidFd, e.g. MemFS files) are never direct and
// their I/O is routed through the file's ReadAt/WriteAt methods by every
// backend.
//
// # Alignment
//
// A direct file (File.Direct() true) only accepts operations whose buffer
// address, length and file offset are multiples of DefaultAlignment (4096).
// Backends reject other operations with an error wrapping ErrMisaligned
// instead of issuing them. Use AlignedBuffer or a BufferPool for buffers; Go
// heap slices are not reliably aligned. Tests on tmpfs or MemFS do not
// enforce alignment: wrap the test file system with devtest.AlignCheckFS.
//
// # Buffer lifetime
//
// A buffer handed to Backend.Submit belongs to the kernel until Submit
// returns; Submit only returns after every completion has been reaped, so
// buffers may be reused or returned to a BufferPool after Submit returns, and
// not before. Likewise a File must not be closed while one of its operations
// is being submitted.
//
// # Durability
//
// O_DIRECT does not make writes durable: call File.SyncData after the writes'
// Submit returns to persist them.
//
// # io_uring
//
// The io_uring backend is compiled only with the build tag "uring" on Linux;
// because github.com/iceber/iouring-go uses go:linkname, binaries and tests
// built with the tag must also be linked with -ldflags=-checklinkname=0:
//
//	go test -race -tags uring -ldflags=-checklinkname=0 ./devio/...
//
// Without the tag, NewBackend(EngineURing, ...) returns an error wrapping
// ErrUnsupported and EngineAuto selects the pread/pwrite backend.
package devio
