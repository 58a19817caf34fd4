/*
 * ucmgo.h: UCM-Go's C ABI (libucmgo.so, built by `make lib`): UCM's store interface
 * (UcmKVStoreBaseV1) over UCM-Go. docs/connector.md is the guide.
 *
 * Handles. A store is an int64_t > 0 from ucmgo_open. A task is an int64_t > 0 from ucmgo_load
 * or ucmgo_dump; ucmgo_wait consumes it, as in UCM (a second wait fails with UCMGO_ENOOBJ);
 * ucmgo_check does not.
 *
 * Errors. Every call returns a status (or a handle, or a length) below zero on failure, one of
 * UCM's codes below, and ucmgo_last_error() then says why, naming the block, position or field
 * at fault. The message is per thread. No call crashes on a bad argument it can see, each is
 * refused with UCMGO_EPARAM before anything reads or writes through it: counts past their
 * bounds (2^24 blocks per call), null pointers with n > 0, pointers and addresses that no
 * caller's memory can have (in the first 4 KiB, or whose bytes, as many as the call would
 * touch there, end past 2^56, the top of user space, or wrap around: -5 or 2^64 - 4096 as an
 * address), address counts and shard indexes the layout does not have, task handles <= 0,
 * unknown or closed store handles, stats buffers over 1 GiB; duplicate ids are
 * UCMGO_EDUPLICATE. It cannot see an address inside user space that points to unmapped
 * memory, or to less memory than the configuration says: such an address is the caller's bug.
 *
 * Memory. Block ids are 16 raw bytes each, n of them back to back. A transfer names per block a
 * shard index and the addresses of the shard's memory: a table of n × addrs_per_block pointers,
 * block-major (UCM's dst_addr[i][j], e.g. a numpy uint64 array of shape (n, k)).
 * addrs_per_block is the number of tensors the configuration gives (tensor_size_list, or
 * shard_size / tensor_size), each address holding that tensor's bytes, or 1: the whole shard at
 * one address. Shard index -1 is the whole block (UCM's whole-block form, a PcStore dump or
 * load with no shard list): its addresses are one per tensor of every shard, shard after shard
 * (shards × tensors), one per shard, or 1 for the whole block at one address. The memory is the caller's (the library never holds a pointer into memory it
 * did not allocate once the task is waited for, and never hands the caller memory of its own):
 * it must stay valid, and unchanged for a dump, until the task is waited for. A load whose
 * addresses are all aligned to 4 KiB (address and tensor size), wherever each tensor lives, is
 * read from disk straight into them with O_DIRECT; a dump copies them once into the record; any
 * other memory (unaligned) goes through a staging buffer.
 *
 * Threads. Every call may be made from any thread, concurrently. A load or dump of up to 32
 * blocks whose arguments are valid returns its task at once, without entering Go (its arguments
 * are copied; it is submitted by a thread already running Go: docs/connector.md, "What the ABI
 * costs"); wait, check and close treat it as any other task. Every other call, and every call
 * with a bad argument, is handled in Go before it returns, so that a bad argument is always
 * reported by the call itself.
 */
#ifndef UCMGO_H
#define UCMGO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* UCM's status codes. */
/* BEGIN STATUS CODES (generated from connector/internal/statuscodes; go generate ./connector/) */
enum {
	UCMGO_OK = 0,
	UCMGO_ERROR = -1, /* a failure no other code names */
	UCMGO_EPARAM = -50000, /* bad argument: pointer, count, size, shard index, handle */
	UCMGO_EOOM = -50001, /* out of memory (staging) */
	UCMGO_EOSERROR = -50002, /* the file system failed an operation */
	UCMGO_EDUPLICATE = -50003, /* the same block twice in one call, or created twice */
	UCMGO_ERETRY = -50004, /* try again (store directory locked by another process) */
	UCMGO_ENOOBJ = -50005, /* no such block, or no such task */
	UCMGO_ESERIALIZE = -50006, /* not returned by UCM-Go */
	UCMGO_EDESERIALIZE = -50007, /* stored bytes failed a check: the block is a miss now */
	UCMGO_EUNSUPPORTED = -50008, /* schema mismatch, or an operation this role does not do */
	UCMGO_ENOSPACE = -50009, /* no space on the tier or in staging memory */
	UCMGO_ETIMEOUT = -50010, /* the task outlived timeout_ms and was cancelled */
};
/* END STATUS CODES */

/* UCMGO_ID_BYTES is the size of a block id. */
#define UCMGO_ID_BYTES 16

/*
 * ucmgo_open opens a store. config is YAML or JSON text (a whole UCM configuration with
 * ucm_connectors, or the mapping UCM's connector hands its store: storage_backends, block_size,
 * shard_size, tensor_size or tensor_size_list, device_id, ...), or the path of a file holding
 * one; NULL or "" reads the file the environment variable UCM_CONFIG_FILE names. Every process
 * configured with the same storage_backends opens its own instance there and sees the blocks of
 * the others. A configuration without shard and tensor sizes is UCM's scheduler: its store only
 * looks up. UCM's environment variables (UCM_CONFIG_FILE, UCM_STORAGE_PATH, UCM_METRICS_ENABLE,
 * ...) are read from the environment the process had when the library was loaded: changes made
 * since (setenv, Python's os.environ) are not seen; ucmgo_open_env takes them. Returns a store
 * handle > 0, or a status < 0.
 */
int64_t ucmgo_open(const char *config);

/*
 * ucmgo_open_env is ucmgo_open reading UCM's environment variables from env instead: a
 * NULL-terminated array of "NAME=value" strings, as execve's envp (the first entry of a name
 * counts), at most 65536 entries of at most 1 MiB each. env NULL is ucmgo_open.
 */
int64_t ucmgo_open_env(const char *config, const char *const *env);

/* ucmgo_close waits for the store's tasks, closes it and frees the handle. */
int32_t ucmgo_close(int64_t store);

/* ucmgo_lookup sets found[i] to 1 when block i is stored, else 0 (exact, per block). */
int32_t ucmgo_lookup(int64_t store, const uint8_t *ids, size_t n, uint8_t *found);

/*
 * ucmgo_lookup_on_prefix sets *index to the index of the last block of the leading run of stored
 * blocks: -1 when block 0 is not stored, n - 1 when all are (UCM's lookup_on_prefix).
 */
int32_t ucmgo_lookup_on_prefix(int64_t store, const uint8_t *ids, size_t n, int64_t *index);

/* ucmgo_prefetch starts moving the blocks to the fastest tier and returns at once. */
int32_t ucmgo_prefetch(int64_t store, const uint8_t *ids, size_t n);

/*
 * ucmgo_load starts loading shard shards[i] of block i into the memory addrs gives for it.
 * Every shard's checksum is checked before its block counts as loaded; a block not stored, or
 * whose bytes fail a check, fails alone (see ucmgo_wait's failed). Returns a task handle > 0, or
 * a status < 0 (then nothing was started).
 */
int64_t ucmgo_load(int64_t store, const uint8_t *ids, const int64_t *shards, size_t n,
                   void *const *addrs, size_t addrs_per_block);

/*
 * ucmgo_dump starts storing shard shards[i] of block i from the memory addrs gives for it. A
 * block becomes visible to lookups once every shard of it is durable; one whose shard fails is
 * never published with holes. prerequisite is UCM's device event to wait for before copying:
 * host memory has none, so it is accepted and unused. Returns a task handle > 0, or a status < 0.
 */
int64_t ucmgo_dump(int64_t store, const uint8_t *ids, const int64_t *shards, size_t n,
                   void *const *addrs, size_t addrs_per_block, uint64_t prerequisite);

/*
 * ucmgo_wait blocks until the task is done (at most the configured timeout_ms: then it is
 * cancelled and drained, UCMGO_ETIMEOUT) and consumes its handle. Returns UCMGO_OK when every
 * block succeeded, else the status of the failure. failed, when not NULL, must hold one entry
 * per block of the task (n): failed[i] is set to 1 for each block that failed (a load's failed
 * blocks are recomputed by the engine), else 0. A wrong n is UCMGO_EPARAM and does not consume
 * the handle; so is an n above 2^24 (more blocks than one call takes), whatever failed and the
 * task are.
 */
int32_t ucmgo_wait(int64_t store, int64_t task, uint8_t *failed, size_t n);

/*
 * ucmgo_check sets *finished to 1 when the task is done, successfully or not, else 0, without
 * consuming it. Returns UCMGO_OK, or the task's failure status once it is done.
 */
int32_t ucmgo_check(int64_t store, int64_t task, int32_t *finished);

/*
 * ucmgo_create reserves blocks for a V0 dump (data then comes with ucmgo_dump; ucmgo_commit
 * publishes or discards them); results[i] is block i's status (UCMGO_EDUPLICATE for a block
 * stored or being created). Returns UCMGO_OK when the call itself was valid.
 */
int32_t ucmgo_create(int64_t store, const uint8_t *ids, size_t n, int32_t *results);

/*
 * ucmgo_commit publishes (success != 0) or discards blocks reserved by ucmgo_create and returns
 * once they are durable and visible, or discarded. A block with shards missing is discarded.
 */
int32_t ucmgo_commit(int64_t store, const uint8_t *ids, size_t n, int32_t success);

/*
 * ucmgo_stats writes the store's state as a JSON object into buf (instance, scheduler, layout,
 * tensors, io_engine, direct_io, metrics_address, and the engine's counters under "stats"),
 * NUL-terminated. Returns the JSON's length: when it is len or more the text was cut, call again
 * with a larger buffer (buf may be NULL to ask). Below zero: a status.
 */
int64_t ucmgo_stats(int64_t store, char *buf, size_t len);

/* ---- BEGIN SPARSE ATTENTION: SELECTORS ------------------------------------------------------
 *
 * A selector is a sparse-attention method (ESA, Quest, GSA, KVStarMultiStep, GSAOnDevice) over a
 * store: it writes the blocks' representations into the store as sidecars of the blocks
 * (computed from K on the host, or precomputed), reads them back by block id, and selects the
 * blocks a decode step of a layer attends, with exactly the semantics of the method's hooks
 * (windows, budget, retrieval stride, lag, per-KV-head selection; docs/sparse.md).
 * Representations survive restarts, are seen by every instance sharing the store's backends,
 * and go with their block. A handle is an int64_t > 0 from ucmgo_selector_open; closing the
 * store closes its selectors. Bad arguments are UCMGO_EPARAM with ucmgo_last_error naming the
 * field, as everywhere in this header.
 *
 * Representation layout (ucmgo_reprs_shape): one layer of one block is rows x heads x cols
 * float32, row-major; a whole block is layers of those. ESA (and GSA): rows 1, cols head_dim
 * (the mean, or the max with pool: max). Quest: rows 2 (per-channel min, then max). KVStar:
 * rows 1 + block_size / merge: row 0 holds each head's kept channels (integers, ascending), then
 * the merged rows; cols the kept channels. GSAOnDevice: rows block_size (one per token), cols
 * the code bytes of a token and head, each byte as a float in [0, 255]. Values are stored as
 * float16.
 */

/* Sidecar kinds (ucmgo_reprs_shape's kind). */
enum {
	UCMGO_REPR_ESA_MEAN = 1,
	UCMGO_REPR_ESA_MAX = 2,
	UCMGO_REPR_QUEST = 3,
	UCMGO_REPR_KVSTAR = 4,
	UCMGO_REPR_HASH = 5,
};

/* K dtypes (ucmgo_reprs_dump's k_dtype). */
enum {
	UCMGO_DTYPE_FLOAT16 = 1,
	UCMGO_DTYPE_BFLOAT16 = 2,
	UCMGO_DTYPE_FLOAT8_E4M3 = 3,
	UCMGO_DTYPE_FLOAT8_E5M2 = 4,
	UCMGO_DTYPE_FLOAT32 = 5,
};

/*
 * ucmgo_selector_open builds a selector over a worker's store. sparse_config is a
 * ucm_sparse_config mapping in YAML or JSON ({"ESA": {"sparse_ratio": 0.3}}, or a document
 * with it under ucm_sparse_config) enabling one method (several need sparse_type); shape is a
 * JSON object {"layers", "q_heads", "kv_heads", "head_dim", "block_size"}. Returns a selector
 * handle > 0, or a status < 0.
 */
int64_t ucmgo_selector_open(int64_t store, const char *sparse_config, const char *shape);

/* ucmgo_selector_close waits for the selector's selections and frees the handle. */
int32_t ucmgo_selector_close(int64_t selector);

/* ucmgo_reprs_shape writes the representation layout (above) and the kind. */
int32_t ucmgo_reprs_shape(int64_t selector, int64_t *layers, int64_t *rows, int64_t *heads, int64_t *cols,
                          int32_t *kind);

/*
 * ucmgo_reprs_dump computes each block's representation from its K and starts storing it:
 * k_addrs is n x addrs_per_block pointers, block-major, addrs_per_block the layers, each
 * pointing to [block_size][kv_heads][head_dim] of k_dtype (read before the call returns).
 * Returns a task of the selector's store, waited with ucmgo_wait(store, task, failed, n): a
 * block that is not stored fails alone (UCMGO_ENOOBJ); one that already has this kind of
 * representation keeps it. Or a status < 0.
 */
int64_t ucmgo_reprs_dump(int64_t selector, const uint8_t *ids, size_t n, void *const *k_addrs,
                         size_t addrs_per_block, int32_t k_dtype);

/*
 * ucmgo_reprs_put starts storing precomputed representations: reprs is n x floats_per_block
 * float32, floats_per_block = layers x rows x heads x cols (read before the call returns).
 * Returns a store task as ucmgo_reprs_dump does, or a status < 0.
 */
int64_t ucmgo_reprs_put(int64_t selector, const uint8_t *ids, size_t n, const float *reprs,
                        size_t floats_per_block);

/*
 * ucmgo_reprs_load reads one layer's representation of each block into dst (n x
 * floats_per_block float32, floats_per_block = rows x heads x cols) and sets found[i] to 1 when
 * block i has one, else 0 (its values are zero: not stored, never given one, or failing a
 * check); a block's miss loses nothing else.
 */
int32_t ucmgo_reprs_load(int64_t selector, int32_t layer, const uint8_t *ids, size_t n, float *dst,
                         size_t floats_per_block, uint8_t *found);

/*
 * ucmgo_select_submit starts selecting the blocks decode step `step` of `layer` attends for a
 * request. q is the step's queries after RoPE, q_len floats ([tokens][q_heads][head_dim], the
 * last token's select); ids are the stored ids of the request's leading full blocks (n); the
 * context is ceil(seq_len / block_size) blocks, at least n (the blocks past n have no
 * representation: they are kept first within the budget). q, ids and request_id are copied.
 * Outputs, written before the task counts as finished: out_blocks (out_capacity >= the context's
 * blocks) the attended blocks' positions, ascending, out_count their number (every block when
 * the windows and budget cover the context); out_heads (kv_heads x out_capacity, head-major)
 * and out_head_counts (kv_heads), both NULL or both given: each KV head's own selection with
 * head_select: kv, else every head gets out_blocks. The outputs must stay valid until
 * ucmgo_select_release returns. Selections of one (request, layer) run in submission order.
 * Returns a selection task > 0, or a status < 0.
 */
int64_t ucmgo_select_submit(int64_t selector, const char *request_id, int32_t layer, int64_t step, const float *q,
                            size_t q_len, const uint8_t *ids, size_t n, int64_t seq_len, int32_t *out_blocks,
                            size_t out_capacity, int64_t *out_count, int32_t *out_heads, int64_t *out_head_counts);

/* ucmgo_select is ucmgo_select_submit, wait and release: the selection's status, outputs written. */
int32_t ucmgo_select(int64_t selector, const char *request_id, int32_t layer, int64_t step, const float *q,
                     size_t q_len, const uint8_t *ids, size_t n, int64_t seq_len, int32_t *out_blocks,
                     size_t out_capacity, int64_t *out_count, int32_t *out_heads, int64_t *out_head_counts);

/*
 * ucmgo_select_check sets *finished to 1 when the selection task is done (outputs written),
 * else 0, without consuming it. Returns UCMGO_OK, or the selection's failure status once done.
 */
int32_t ucmgo_select_check(int64_t selector, int64_t task, int32_t *finished);

/* ucmgo_select_wait blocks until the selection task is done; returns its status; repeatable. */
int32_t ucmgo_select_wait(int64_t selector, int64_t task);

/*
 * ucmgo_select_release waits for the selection task and frees it: nothing is written into its
 * outputs afterwards, and the handle is unknown (UCMGO_ENOOBJ) to every later call.
 */
int32_t ucmgo_select_release(int64_t selector, int64_t task);

/*
 * ucmgo_selector_request_finished forgets a request's state in the selector's method (held
 * selections, lag, representation pool references) once its selections in flight are done.
 */
int32_t ucmgo_selector_request_finished(int64_t selector, const char *request_id);

/*
 * ucmgo_selector_retrieve_dot is ESA's retrieval (UCMGO_RM_DOT, "RETRIEVER" below) over the
 * representations the store holds instead of a matrix the caller keeps: layer's representation
 * of each of the n blocks of ids is read from the store by id (one sidecar read, verified,
 * float16 decoded to float32) and row i of the matrix is ids[i]'s (dim = rows x heads x cols of
 * ucmgo_reprs_shape: ESA's and GSA's one row per block; other methods are UCMGO_EPARAM). query
 * is batch rows of dim floats; cand holds batch rows of cand_width positions into ids, -1 for
 * none (NULL: every block is a candidate of every row). Synchronous: the retrieval runs on the
 * calling thread and up to workers - 1 helpers (workers 1 to 1024), and everything is read and
 * written before the call returns. Row b's results are out_idx[b*topk ...] (positions into
 * ids) and out_scores[b*topk ...] (float32 dot products), score descending, ties to the earlier
 * candidate in the row: out_count[b] (out_count may be NULL) entries, then -1 and -inf. A block
 * without a stored representation (not stored, none dumped, failing its check) is no candidate
 * of any row: out_count[b] is min(topk, row b's candidates that have one), and found[i] (found
 * may be NULL, else n bytes) is 0 for it, 1 for the others. Bad arguments are UCMGO_EPARAM
 * naming the argument (dim, batch, topk, workers, cand_width, a candidate outside [-1, n) by
 * row and column, a pointer that cannot be the caller's memory); nothing is written then.
 */
int32_t ucmgo_selector_retrieve_dot(int64_t selector, int32_t layer, const uint8_t *ids, size_t n, const float *query,
                                    int64_t batch, int64_t dim, const int32_t *cand, int64_t cand_width, int32_t topk,
                                    int32_t workers, int32_t *out_idx, float *out_scores, int64_t *out_count,
                                    uint8_t *found);

/* ---- END SPARSE ATTENTION: SELECTORS -------------------------------------------------------- */

/*
 * ucmgo_last_error returns the calling thread's last error message: the reason of the last call
 * on this thread that failed ("" before any). It stays valid until the next failing call on the
 * same thread. It is at most 4095 bytes: a longer one (a task whose blocks each failed, one line
 * per block) is cut at the end of a line and ends "... (N more lines)".
 */
const char *ucmgo_last_error(void);

/* BEGIN RETRIEVER (sparse retrieval over a caller's representation matrix) */

/*
 * A retriever runs retrievals over representation rows the caller keeps in memory: the CPU
 * work of UCM's sparse modules (ESA's retrieval_backend), as tasks on a pool of worker
 * threads. docs/connector.md, "Sparse retrieval", is the guide.
 *
 * UCMGO_RM_DOT (ESA): for each of batch query rows q[b] (dim floats), the topk rows r of reprs
 * (n_reprs rows of dim floats) among the row's candidates with the largest float32 q[b]·r,
 * score descending, ties to the earlier candidate in the row. cand holds batch rows of
 * cand_width row numbers, -1 for none (padding; duplicates are scored twice); NULL makes every
 * row of reprs a candidate of every query row. Row b's results are out_idx[b*topk ...] and
 * out_scores[b*topk ...]: min(topk, its candidates) entries, then -1 and -inf; out_count[b]
 * (out_count may be NULL) is that count.
 *
 * UCMGO_RM_MAXDOT (GSA offload: UCM's gsa_offload_ops CalKpreAndTopk, one layer): batch
 * requests; q[b] is q_heads x dim floats; reprs is n_reprs blocks of kv_heads x rows_per_block
 * x dim floats (block-major: UCM's kpre cache). Request b's blocks are its row of cand that
 * are not -1, in order (NULL: every block of reprs); each block scores
 * Σ_h max_m mean_g(q)_h·r[block][h][m], the mean over the g = q_heads / kv_heads query heads of
 * KV head h (summed in head order, then times float32(1/g)). Its selection, in UCM's order: all
 * its n blocks 0 … n-1 when init + local >= n or k >= n; none when n or k is 0; else the init
 * leading positions, the local trailing ones, then the k - init - local best of those between
 * (score descending, ties to the earlier). Positions are indices into the request's block
 * list. k is row_topk[b] (row_topk NULL: topk for every request); topk is the width of out_idx's
 * rows, which must hold each selection; the rest of a row is left as it was. out_count[b]
 * is the selection's length. out_scores must be NULL. q is not modified (UCM's module writes
 * the means over its rows).
 *
 * UCMGO_RM_SOFTMAX (KVStar: UCM's kvstar_retrieve AsyncRetrieveByCPU): batch query tokens of
 * q_heads x dim float16 values (q_dtype and r_dtype UCMGO_DTYPE_FLOAT16 or 0); reprs is n_reprs
 * blocks of rows_per_block x kv_heads x w float16 values, w = kept with channels, else dim.
 * channels (kv_heads x kept channel numbers in [0, dim)) names the query channels each KV
 * head's rows keep (UCM's dPrunedIndex). Query head H reads KV head H / g; its logits are the
 * unscaled dot products with every row of every block, a softmax over all of them per (token,
 * head), and a block's score is the probability of its rows summed over tokens and heads.
 * out_idx receives min(topk, n_reprs) block numbers, score descending (ties to the lower
 * block), then -1 up to topk; out_count (one entry, or NULL) that count. cand, row_topk and
 * out_scores must be NULL, init and local 0.
 *
 * A field a method does not use must be 0 (NULL): anything else is UCMGO_EPARAM naming it.
 */
enum { UCMGO_RM_DOT = 1, UCMGO_RM_MAXDOT = 2, UCMGO_RM_SOFTMAX = 3 };

typedef struct ucmgo_retrieval {
	size_t size;          /* sizeof(ucmgo_retrieval): any other value is UCMGO_EPARAM */
	int32_t method;       /* UCMGO_RM_DOT, UCMGO_RM_MAXDOT or UCMGO_RM_SOFTMAX */
	int32_t topk;         /* >= 0 */
	int64_t batch;        /* DOT: query rows; MAXDOT: requests; SOFTMAX: query tokens; >= 0 */
	int64_t dim;          /* values per row (DOT), per head (MAXDOT, SOFTMAX's q), >= 1 */
	const void *q;        /* copied at submit */
	const void *reprs;    /* read in place until the task is done */
	int64_t n_reprs;      /* DOT: rows; MAXDOT, SOFTMAX: blocks */
	const int32_t *cand;  /* batch x cand_width, or NULL: copied at submit */
	int64_t cand_width;
	int32_t *out_idx;     /* DOT, MAXDOT: batch x topk; SOFTMAX: topk */
	float *out_scores;    /* DOT: batch x topk */
	int64_t *out_count;   /* DOT, MAXDOT: batch; SOFTMAX: 1; or NULL */
	/* MAXDOT and SOFTMAX (0 for DOT) */
	int32_t q_dtype;      /* 0 or the method's: UCMGO_DTYPE_FLOAT32 (DOT, MAXDOT), _FLOAT16 (SOFTMAX) */
	int32_t r_dtype;      /* likewise, for reprs */
	int64_t q_heads;      /* query heads, a multiple of kv_heads, at most 1024 */
	int64_t kv_heads;
	int64_t rows_per_block; /* MAXDOT: rows per block and KV head; SOFTMAX: rows per block */
	const int64_t *channels; /* SOFTMAX: kv_heads x kept, or NULL: copied at submit */
	int64_t kept;         /* SOFTMAX with channels: values per KV head in a row of reprs */
	const int32_t *row_topk; /* MAXDOT: batch selection lengths, or NULL: copied at submit */
	int32_t init;         /* MAXDOT: leading window (UCM: 1) */
	int32_t local;        /* MAXDOT: trailing window (UCM: 2) */
} ucmgo_retrieval;

/*
 * ucmgo_retriever_new starts a retriever of workers threads (1 to 1024); with ncpus > 0, worker
 * i is pinned to CPU cpus[i % ncpus] (a CPU the process may not run on is UCMGO_EPARAM). A
 * task's retrieval runs on one worker with up to workers - 1 helpers. Returns a
 * retriever handle > 0, or a status < 0.
 */
int64_t ucmgo_retriever_new(int32_t workers, const int32_t *cpus, size_t ncpus);

/* ucmgo_retriever_free waits for the retriever's queued tasks, stops it and frees the handle. */
int32_t ucmgo_retriever_free(int64_t retriever);

/*
 * ucmgo_retrieve_submit validates *a and queues its retrieval. Every bad field is UCMGO_EPARAM
 * here, naming it: size, method, dims and counts out of range (each product at most 2^31
 * elements), pointers that cannot be the caller's memory for their extent, a candidate outside
 * [-1, n_reprs) (naming its row and column), a channel outside [0, dim), a MAXDOT selection
 * longer than topk (naming the request). Nothing is read from reprs or written to the
 * outputs before it returns a task handle > 0; both are the caller's memory, which must stay
 * valid (reprs unchanged) until ucmgo_retrieve_check says finished or ucmgo_retrieve_wait
 * returns.
 */
int64_t ucmgo_retrieve_submit(int64_t retriever, const ucmgo_retrieval *a);

/*
 * ucmgo_retrieve_check sets *finished to 1 when the task is done, else 0, without consuming
 * it. UCMGO_ENOOBJ for a task never returned or already released.
 */
int32_t ucmgo_retrieve_check(int64_t retriever, int64_t task, int32_t *finished);

/* ucmgo_retrieve_wait blocks until the task is done, without consuming it (repeatable). */
int32_t ucmgo_retrieve_wait(int64_t retriever, int64_t task);

/* ucmgo_retrieve_release waits for the task and consumes it: UCMGO_ENOOBJ afterwards. */
int32_t ucmgo_retrieve_release(int64_t retriever, int64_t task);

/*
 * ucmgo_retrieve runs *a to completion on the calling thread, with up to workers - 1 of the
 * retriever's helpers (ucmgo_retrieve_submit's validation, then the results).
 */
int32_t ucmgo_retrieve(int64_t retriever, const ucmgo_retrieval *a);

/* END RETRIEVER */

#ifdef __cplusplus
}
#endif
#endif /* UCMGO_H */
