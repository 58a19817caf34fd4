"""RetrievalWorkerBackend: UCM's ESA CPU retrieval module over UCM-Go's retriever.

A drop-in for ucm.sparse.esa.retrieval.retrieval_backend (UCM's pybind11 module): swap the
import and UCM's RetrievalWorker, and ESA, run unchanged.

    from ucmgo.sparse.esa import retrieval_backend
    backend = retrieval_backend.RetrievalWorkerBackend(data, {0: [0, 1]})
    rid = backend.submit(query, topk, indexes)
    backend.wait(rid)
    result = backend.get_result(rid)   # {"indices": int32 [B, k], "scores": float32 [B, k]}

Same as UCM: data is aliased when it is a C-contiguous float32 CPU array or tensor (writes to
it after construction are seen by later submissions), else copied once; one worker per core
listed, pinned to it; ids 0, 1, 2, ...; scores are float32 dot products, rows score
descending, k = min(topk, row 0's candidates); the error messages ("Query dim mismatch",
"Query and indexes batch mismatch", "Bad req_id", "Result not ready"); wait is repeatable and
get_result consumes. Where UCM's behaviour is undefined, this module says what happens instead:
an empty cpu_idx_tbl is a ValueError (UCM: wait hangs), a candidate outside [-1, rows) an
IndexError at submit (UCM reads past data), a negative topk a ValueError, a row with fewer
candidates than row 0 padded with -1 and -inf (UCM reads past its vectors); equal scores rank
the earlier candidate first (UCM: unspecified); wait releases the GIL. Cores the process may
not run on are left out of the pinning (UCM prints an error and runs on).

StoreRetrievalBackend(selector, layer, block_ids, cpu_idx_tbl) is the same interface over the
representations a ucmgo.sparse.Selector stored beside the blocks, read from the store by block
id at each request instead of a matrix the caller keeps (row i is block_ids[i]'s).
"""

import concurrent.futures
import ctypes
import os
import threading

import numpy as np

from .. import _abi

__all__ = ["RetrievalWorkerBackend", "StoreRetrievalBackend"]


def _as_matrix(data):
    """data as a 2-D C-contiguous float32 array: a view when it already is one (numpy, or a
    CPU torch tensor through __array__), else a copy (pybind11's forcecast)."""
    arr = np.asarray(data)
    if arr.dtype != np.float32 or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
    if arr.ndim != 2:
        raise ValueError("data: %d dimensions, want 2 (rows, dim)" % arr.ndim)
    return arr


class _Job:
    __slots__ = ("task", "idx", "scores", "count")

    def __init__(self, task, idx, scores, count):
        self.task, self.idx, self.scores, self.count = task, idx, scores, count


class RetrievalWorkerBackend:
    """UCM's RetrievalWorkerBackend(data, cpu_idx_tbl) over UCM-Go (module docstring)."""

    def __init__(self, data, cpu_idx_tbl):
        self._lib = _abi.get()
        self._h = 0
        self._source = data  # keeps an aliased tensor alive, as pybind11 keeps the array
        self._data = _as_matrix(data)
        self._rows, self._dim = self._data.shape
        cores = [int(c) for cs in dict(cpu_idx_tbl).values() for c in cs]
        if not cores:
            raise ValueError("cpu_idx_tbl lists no core: there would be no worker (UCM's wait would hang)")
        allowed = os.sched_getaffinity(0)
        pinned = [c for c in cores if c in allowed]
        cpus = (ctypes.c_int32 * max(len(pinned), 1))(*pinned)
        h = self._lib.ucmgo_retriever_new(len(cores), cpus, len(pinned))
        if h <= 0:
            raise _abi.error("ucmgo_retriever_new", h)
        self._h = h
        self._mu = threading.Lock()
        self._jobs = {}
        self._next = 0
        self._args = _abi.Retrieval(size=ctypes.sizeof(_abi.Retrieval), method=_abi.RM_DOT, dim=self._dim,
                                    reprs=self._data.ctypes.data if self._data.size else None, n_reprs=self._rows)

    def submit(self, query, topk, indexes) -> int:
        """Queues the top-topk search of each query row among its row of indexes (-1: none) and
        returns the request's id."""
        q = np.asarray(query, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self._dim:
            raise RuntimeError("Query dim mismatch")
        idx = np.asarray(indexes)
        if idx.dtype != np.int32:
            idx = idx.astype(np.int32)  # pybind11's forcecast of array_t<int>
        if idx.ndim != 2:
            raise ValueError("indexes: %d dimensions, want 2 (batch, candidates)" % idx.ndim)
        if idx.shape[0] != q.shape[0]:
            raise RuntimeError("Query and indexes batch mismatch")
        topk = int(topk)
        if topk < 0 or topk >= 1 << 31:
            raise ValueError("topk %d: want 0 ... 2^31-1" % topk)
        q = np.ascontiguousarray(q)
        idx = np.ascontiguousarray(idx)
        if idx.size:
            lo, hi = int(idx.min()), int(idx.max())
            if lo < -1 or hi >= self._rows:
                bad = np.argwhere((idx < -1) | (idx >= self._rows))[0]
                raise IndexError("indexes[%d, %d] = %d: outside [-1, %d) (the rows of data)"
                                 % (bad[0], bad[1], idx[bad[0], bad[1]], self._rows))
        b = q.shape[0]
        out_idx = np.empty((b, topk), dtype=np.int32)
        out_scores = np.empty((b, topk), dtype=np.float32)
        count = np.empty(b, dtype=np.int64)
        with self._mu:
            a = self._args
            a.topk, a.batch = topk, b
            a.q = q.ctypes.data if q.size else None
            # No candidates is an empty list per row: a table that is not NULL (NULL: every row).
            a.cand, a.cand_width = (idx.ctypes.data if idx.size else _EMPTY_ADDR), idx.shape[1]
            a.out_idx = out_idx.ctypes.data if out_idx.size else None
            a.out_scores = out_scores.ctypes.data if out_scores.size else None
            a.out_count = count.ctypes.data if b else None
            task = self._lib.ucmgo_retrieve_submit(self._h, ctypes.byref(a))
            if task <= 0:
                raise _abi.error("ucmgo_retrieve_submit", task)
            rid = self._next
            self._next += 1
            self._jobs[rid] = _Job(task, out_idx, out_scores, count)
        return rid

    def poll(self, req_id) -> bool:
        """True when the request's result is ready and not yet taken."""
        job = self._jobs.get(req_id)
        if job is None:
            return False
        fin = ctypes.c_int32()
        st = self._lib.ucmgo_retrieve_check(self._h, job.task, ctypes.byref(fin))
        if st != 0:
            raise _abi.error("ucmgo_retrieve_check", st)
        return bool(fin.value)

    def wait(self, req_id) -> None:
        """Blocks until the request is done (repeatable, also after get_result); "Bad req_id"
        for an id never returned."""
        job = self._jobs.get(req_id)
        if job is None:
            if isinstance(req_id, int) and 0 <= req_id < self._next:
                return  # done and taken
            raise RuntimeError("Bad req_id")
        st = self._lib.ucmgo_retrieve_wait(self._h, job.task)
        if st != 0:
            raise _abi.error("ucmgo_retrieve_wait", st)

    def get_result(self, req_id) -> dict:
        """The request's {"indices": int32 [B, k], "scores": float32 [B, k]}, taken: a second
        call, or a call before it is done, raises "Result not ready"."""
        if not self.poll(req_id):
            raise RuntimeError("Result not ready")
        with self._mu:
            job = self._jobs.pop(req_id, None)
        if job is None:  # taken by a concurrent call
            raise RuntimeError("Result not ready")
        st = self._lib.ucmgo_retrieve_release(self._h, job.task)
        if st != 0:
            raise _abi.error("ucmgo_retrieve_release", st)
        k = int(job.count[0]) if job.count.size else 0
        idx, scores = job.idx, job.scores
        if k < idx.shape[1]:
            idx, scores = np.ascontiguousarray(idx[:, :k]), np.ascontiguousarray(scores[:, :k])
        return {"indices": idx, "scores": scores}

    def close(self) -> None:
        """Waits for the queued requests and stops the workers (as UCM's destructor does)."""
        h, self._h = self._h, 0
        if h > 0:
            self._lib.ucmgo_retriever_free(h)

    def __del__(self):
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class StoreRetrievalBackend:
    """UCM's RetrievalWorkerBackend interface (submit, poll, wait, get_result) over the
    representations selector stored for block_ids at layer, read from the store by block id at
    each request (ucmgo_selector_retrieve_dot) instead of a data matrix.

    indexes and the returned indices are positions into block_ids; the query rows have the
    selector's layer_floats values (ESA: kv_heads × head_dim). A block without a stored
    representation (not stored, none dumped, failing its check) is no candidate: it is never
    returned, and k = min(topk, row 0's candidates with one); rows with fewer are padded with -1
    and -inf. Requests run one after another, in submission order, on one thread of this
    backend, each on that thread and len(cores) - 1 helpers of the library's (the Go runtime
    schedules them: no pinning). The messages and checks are RetrievalWorkerBackend's; an
    error of the retrieval itself (the selector closed, a store failure) is raised by wait and
    get_result.
    """

    def __init__(self, selector, layer, block_ids, cpu_idx_tbl):
        cores = [int(c) for cs in dict(cpu_idx_tbl).values() for c in cs]
        if not cores:
            raise ValueError("cpu_idx_tbl lists no core: there would be no worker (UCM's wait would hang)")
        if selector.rows != 1:
            raise ValueError("selector's %s representation has %d rows per block: the dot retrieval takes one (ESA, GSA)"
                             % (selector.kind, selector.rows))
        self._sel = selector
        self._layer = int(layer)
        self._ids = list(block_ids)
        self._rows, self._dim = len(self._ids), selector.layer_floats
        self._workers = min(len(cores), 1024)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ucmgo-store-retrieval")
        self._mu = threading.Lock()
        self._jobs = {}
        self._next = 0

    def submit(self, query, topk, indexes) -> int:
        """Queues the top-topk search of each query row among its row of indexes (positions into
        block_ids, -1: none) and returns the request's id."""
        q = np.asarray(query, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self._dim:
            raise RuntimeError("Query dim mismatch")
        idx = np.asarray(indexes)
        if idx.dtype != np.int32:
            idx = idx.astype(np.int32)
        if idx.ndim != 2:
            raise ValueError("indexes: %d dimensions, want 2 (batch, candidates)" % idx.ndim)
        if idx.shape[0] != q.shape[0]:
            raise RuntimeError("Query and indexes batch mismatch")
        topk = int(topk)
        if topk < 0 or topk >= 1 << 31:
            raise ValueError("topk %d: want 0 ... 2^31-1" % topk)
        q, idx = np.array(q, dtype=np.float32, order="C"), np.array(idx, dtype=np.int32, order="C")  # copies: the caller may reuse its arrays
        if idx.size:
            bad = np.argwhere((idx < -1) | (idx >= self._rows))
            if len(bad):
                raise IndexError("indexes[%d, %d] = %d: outside [-1, %d) (the blocks of block_ids)"
                                 % (bad[0][0], bad[0][1], idx[bad[0][0], bad[0][1]], self._rows))
        with self._mu:
            fut = self._pool.submit(self._sel.retrieve_dot, self._layer, self._ids, q, topk, idx, self._workers)
            rid = self._next
            self._next += 1
            self._jobs[rid] = fut
        return rid

    def poll(self, req_id) -> bool:
        """True when the request's result is ready and not yet taken."""
        fut = self._jobs.get(req_id)
        return fut is not None and fut.done()

    def wait(self, req_id) -> None:
        """Blocks until the request is done (repeatable, also after get_result); "Bad req_id"
        for an id never returned; raises the retrieval's error."""
        fut = self._jobs.get(req_id)
        if fut is None:
            if isinstance(req_id, int) and 0 <= req_id < self._next:
                return  # done and taken
            raise RuntimeError("Bad req_id")
        fut.result()

    def get_result(self, req_id) -> dict:
        """The request's {"indices": int32 [B, k], "scores": float32 [B, k]}, taken: a second
        call, or a call before it is done, raises "Result not ready"."""
        if not self.poll(req_id):
            raise RuntimeError("Result not ready")
        with self._mu:
            fut = self._jobs.pop(req_id, None)
        if fut is None:  # taken by a concurrent call
            raise RuntimeError("Result not ready")
        res = fut.result()
        return {"indices": res["indices"], "scores": res["scores"]}

    def close(self) -> None:
        """Waits for the queued requests and stops the backend's thread."""
        self._pool.shutdown(wait=True)

    def __del__(self):
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


# A valid address for an empty candidate table (cand_width 0): the library reads nothing there.
_EMPTY = np.zeros(1, dtype=np.int32)
_EMPTY_ADDR = _EMPTY.ctypes.data
