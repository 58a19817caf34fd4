// internal.h: what the library's C files (tasks.c, queue.c, lasterror.c) and its Go side
// (main.go) share. Not installed: ucmgo.h is the public header.
#ifndef UCMGO_INTERNAL_H
#define UCMGO_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

// The addresses a caller's memory can have: not in the first page (never mapped: a small
// integer passed as a pointer) and below 2^56, the top of user space with 5-level paging on
// x86-64 (4-level: 2^47; arm64: at most 2^52). Every pointer and address an entry point reads or
// hands to I/O is checked against them first (main.go; queue.c and tasks.c before they read):
// what is outside cannot be the caller's memory, and slicing it would crash the Go runtime.
#define UCMGOI_MIN_ADDR 4096ULL
#define UCMGOI_MAX_ADDR 0x100000000000000ULL

// ucmgoi_plausible: count entries of size bytes at p lie inside [UCMGOI_MIN_ADDR,
// UCMGOI_MAX_ADDR), or count is 0.
static inline int ucmgoi_plausible(const void *p, uint64_t count, uint64_t size) {
	if (count == 0) return 1;
	uint64_t a = (uint64_t)(uintptr_t)p, bytes;
	if (__builtin_mul_overflow(count, size, &bytes)) return 0;
	return a >= UCMGOI_MIN_ADDR && a <= UCMGOI_MAX_ADDR && bytes <= UCMGOI_MAX_ADDR - a;
}

// UCMGOI_MAX_BLOCKS bounds n in one call (main.go's maxBlocks): no call sizes an allocation
// from an unchecked length, and a larger n is UCMGO_EPARAM whatever else the call names.
#define UCMGOI_MAX_BLOCKS (1ULL << 24)

// lasterror.c. UCMGOI_ERROR_MAX bounds a thread's message, its NUL included: main.go cuts a
// longer message to fit, at a line's end, saying how many lines it left off.
#define UCMGOI_ERROR_MAX 4096
void ucmgo_set_error(const char *msg, size_t n);

// tasks.c: tasks whose wait and check are answered in C.
typedef struct ucmgo_task ucmgo_task;
ucmgo_task *ucmgoi_task_new(int64_t store, int64_t id, size_t n);
int ucmgoi_task_done(ucmgo_task *t, int32_t status, const char *msg, size_t msglen, const uint8_t *failed);
void ucmgoi_tasks_drop(int64_t store);

// queue.c: loads and dumps queued in C, submitted from Go.
typedef struct ucmgo_entry {
	struct ucmgo_entry *next;
	int32_t load; // 1: a load, 0: a dump
	int64_t store;
	size_t n, per; // blocks, addresses per block
	ucmgo_task *task;
	uint8_t *ids;    // n × 16 bytes
	int64_t *shards; // n
	void **addrs;    // n × per
} ucmgo_entry;
int ucmgoi_store_add(int64_t h, int64_t shards, size_t tensors, int64_t shard_bytes);
void ucmgoi_store_drop(int64_t h);
void ucmgoi_queue_expect(void);
size_t ucmgoi_queue_take(ucmgo_entry **out, size_t max, int wait, int done_expecting);
void ucmgoi_entry_done(ucmgo_entry *e);
void ucmgoi_queue_flush(void);

#endif
