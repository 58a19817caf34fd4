// internal.h: what the library's C files (tasks.c, queue.c, lasterror.c) and its Go side
// (main.go) share. Not installed: ucmgo.h is the public header.
#ifndef UCMGO_INTERNAL_H
#define UCMGO_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

// lasterror.c
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
int ucmgoi_store_add(int64_t h, int64_t shards, size_t tensors);
void ucmgoi_store_drop(int64_t h);
void ucmgoi_queue_expect(void);
size_t ucmgoi_queue_take(ucmgo_entry **out, size_t max, int wait, int done_expecting);
void ucmgoi_entry_done(ucmgo_entry *e);
void ucmgoi_queue_flush(void);

#endif
