package main

/*
#include <stdint.h>
#include "ucmgo.h"

// The entry points with every address as an integer, cast to a pointer on the C side: a Go
// variable of pointer type must never hold an address that is not one (the fuzz target's
// impossible ones), or the Go runtime, finding it on a stack it copies, aborts.
static int64_t fz_load(int64_t h, uintptr_t ids, uintptr_t shards, size_t n, uintptr_t addrs, size_t per) {
	return ucmgo_load(h, (const uint8_t *)ids, (const int64_t *)shards, n, (void *const *)addrs, per);
}
static int64_t fz_dump(int64_t h, uintptr_t ids, uintptr_t shards, size_t n, uintptr_t addrs, size_t per) {
	return ucmgo_dump(h, (const uint8_t *)ids, (const int64_t *)shards, n, (void *const *)addrs, per, 0);
}
static int32_t fz_wait(int64_t h, int64_t task, uintptr_t failed, size_t n) {
	return ucmgo_wait(h, task, (uint8_t *)failed, n);
}
static int32_t fz_check(int64_t h, int64_t task, uintptr_t finished) {
	return ucmgo_check(h, task, (int32_t *)finished);
}
*/
import "C"

// The C entry points called with raw words, for the fuzz target (main_test.go: a test file
// cannot use cgo itself). ucmgo_load, ucmgo_dump, ucmgo_wait and ucmgo_check are C (queue.c,
// tasks.c), which read some arguments before any Go code sees them; these reach them as a C
// caller does. The exports written in Go are reached through the functions they call (lookup,
// create, ...), which take the same words.

func cLoad(h int64, ids, shards uintptr, n uint64, addrs uintptr, per uint64) int64 {
	return int64(C.fz_load(C.int64_t(h), C.uintptr_t(ids), C.uintptr_t(shards), C.size_t(n), C.uintptr_t(addrs), C.size_t(per)))
}

func cDump(h int64, ids, shards uintptr, n uint64, addrs uintptr, per uint64) int64 {
	return int64(C.fz_dump(C.int64_t(h), C.uintptr_t(ids), C.uintptr_t(shards), C.size_t(n), C.uintptr_t(addrs), C.size_t(per)))
}

func cWait(h, task int64, failed uintptr, n uint64) int32 {
	return int32(C.fz_wait(C.int64_t(h), C.int64_t(task), C.uintptr_t(failed), C.size_t(n)))
}

func cCheck(h, task int64, finished uintptr) int32 {
	return int32(C.fz_check(C.int64_t(h), C.int64_t(task), C.uintptr_t(finished)))
}

// lastError is ucmgo_last_error of the calling thread: the caller must hold its thread
// (runtime.LockOSThread) since the call that failed.
func lastError() string {
	return C.GoString(C.ucmgo_last_error())
}
