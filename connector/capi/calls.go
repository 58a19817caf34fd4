package main

/*
#include "ucmgo.h"
*/
import "C"

import (
	"unsafe"
)

// The C entry points called with raw words, for the fuzz target (main_test.go: a test file
// cannot use cgo itself). ucmgo_load, ucmgo_dump, ucmgo_wait and ucmgo_check are C (queue.c,
// tasks.c), which read some arguments before any Go code sees them; these reach them as a C
// caller does. The exports written in Go are reached through the functions they call (lookup,
// create, ...), which take the same words.

func cLoad(h int64, ids, shards uintptr, n uint64, addrs uintptr, per uint64) int64 {
	return int64(C.ucmgo_load(C.int64_t(h), (*C.uint8_t)(at(ids)), (*C.int64_t)(at(shards)), C.size_t(n), (*unsafe.Pointer)(at(addrs)), C.size_t(per)))
}

func cDump(h int64, ids, shards uintptr, n uint64, addrs uintptr, per uint64) int64 {
	return int64(C.ucmgo_dump(C.int64_t(h), (*C.uint8_t)(at(ids)), (*C.int64_t)(at(shards)), C.size_t(n), (*unsafe.Pointer)(at(addrs)), C.size_t(per), 0))
}

func cWait(h, task int64, failed uintptr, n uint64) int32 {
	return int32(C.ucmgo_wait(C.int64_t(h), C.int64_t(task), (*C.uint8_t)(at(failed)), C.size_t(n)))
}

func cCheck(h, task int64, finished uintptr) int32 {
	return int32(C.ucmgo_check(C.int64_t(h), C.int64_t(task), (*C.int32_t)(at(finished))))
}

// lastError is ucmgo_last_error of the calling thread: the caller must hold its thread
// (runtime.LockOSThread) since the call that failed.
func lastError() string {
	return C.GoString(C.ucmgo_last_error())
}
