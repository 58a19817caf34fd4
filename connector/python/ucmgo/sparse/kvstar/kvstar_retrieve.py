"""kvstar_retrieve: UCM's KVStar CPU retrieval module over UCM-Go's retriever.

A drop-in for ucm.sparse.kvstar.retrieve.kvstar_retrieve (UCM's pybind11 module): swap the
import and KVStar's multistep.py runs unchanged.

    from ucmgo.sparse.kvstar import kvstar_retrieve
    kvstar_retrieve.Setup(kvstar_retrieve.SetupParam(cpuNumaIds=[0], bindInfo=[(0, 0), (1, 0)],
                                                     deviceType=kvstar_retrieve.CPU,
                                                     totalTpSize=1, localRankId=0))
    task = kvstar_retrieve.AsyncRetrieveByCPU(query_group, blk_repre, d_pruned_index, topk,
                                              req_id, kvstar_retrieve.CPU)
    kvstar_retrieve.Wait(task)                      # 0
    kvstar_retrieve.GetTaskResult(task)             # {"status": "SUCCESS", "data": [ids]}

The retrieval (UCMGO_RM_SOFTMAX, docs/connector.md "Sparse retrieval"): queryGroup float16
[x, H, d], blkRepre float16 [n, M, h, d'], dPrunedIndex int64 [h, d'] or None (then d' = d):
query head H reads KV head H / (H/h) through its channels, unscaled dot products with all n·M
rows, a softmax per (token, head) over them, each block scored by its rows' probability summed
over tokens and heads; the topK best blocks.

Same as UCM: one process-wide pool (Setup: one worker per bindInfo entry, pinned to its core);
task ids 1, 2, 3, ...; blkRepre is read in place when it is a contiguous float16 CPU tensor or
array (writes to it before the task is done are seen, as in UCM) and kept referenced until the
task is done; Wait returns 0, or -1 for a failed task, and -50003 (UCM's ENOOBJ) for an id
never returned or already waited; GetTaskResult returns None for an unknown id, else the same
dict every time (results are kept, as UCM keeps them). The ids are UCM's set: UCM returns them
in no defined order, this module by score descending (ties to the lower block), one of the
orders UCM may return.

Where UCM's behaviour is a bug or undefined, this module says what happens instead:
- a bad call (ranks, H not a multiple of h, dPrunedIndex's shape or a channel outside [0, d),
  d != d' without dPrunedIndex, a negative topK) gives a task whose result is
  {"status": "FAILURE", "error": message} and whose Wait is -1 (UCM: SUCCESS with data [] and
  Wait 0, its runner's failure overwritten by its queue);
- topK > n gives all n blocks (UCM: reads past its scores);
- tensors that are not contiguous float16 (int64 for dPrunedIndex) are converted with a copy
  (UCM reads their memory as if they were);
- submitting before Setup starts a pool of 2 unpinned workers (UCM: divides by zero queues);
  a second Setup replaces the pool for later submissions (earlier tasks finish on theirs);
- deviceType and reqId are accepted and not used (UCM logs reqId; its GPU path is not this
  module's);
- while a task runs its status is "PENDING" (UCM tells queued from "RUNNING").
"""

import ctypes
import enum
import os
import threading

import numpy as np

from .. import _abi

__all__ = ["DeviceType", "CPU", "GPU", "SetupParam", "Setup", "AsyncRetrieveByCPU", "Wait", "GetTaskResult"]

# UCM's Status::NotFound (ucm/sparse/kvstar/retrieve/core/infra/status/status.h).
ENOOBJ = -50003


class DeviceType(enum.IntEnum):
    """UCM's DeviceType as its module exports it (CPU 0, GPU 2)."""

    CPU = 0
    GPU = 2


CPU = DeviceType.CPU
GPU = DeviceType.GPU


class SetupParam:
    """UCM's SetupParam: the pool's cores (bindInfo: (core, numa) pairs, one worker each) and
    the rank's placement; attributes read/write as UCM's."""

    def __init__(self, cpuNumaIds, bindInfo, deviceType, totalTpSize, localRankId):
        self.cpuNumaIds = [int(c) for c in cpuNumaIds]
        self.bindInfo = [(int(c), int(n)) for c, n in bindInfo]
        self.deviceType = DeviceType(deviceType)
        self.totalTpSize = int(totalTpSize)
        self.localRankId = int(localRankId)


class _Task:
    __slots__ = ("handle", "task", "refs", "out", "count", "result", "waited", "lock")

    def __init__(self, handle, task, refs, out, count, result):
        self.handle, self.task, self.refs, self.out, self.count = handle, task, refs, out, count
        self.result, self.waited, self.lock = result, False, threading.Lock()


_mu = threading.Lock()
_handle = 0  # the pool new tasks go to
_pools = []  # every pool opened (tasks of a replaced one may still run)
_tasks = {}
_next = 0


def _open(workers, cpus):
    lib = _abi.get()
    arr = (ctypes.c_int32 * max(len(cpus), 1))(*cpus)
    h = lib.ucmgo_retriever_new(workers, arr, len(cpus))
    if h <= 0:
        raise _abi.error("ucmgo_retriever_new", h)
    return h


def Setup(param) -> int:
    """Starts the pool: one worker per param.bindInfo entry, pinned to its core (cores the
    process may not run on are left unpinned); 0. An empty bindInfo is a ValueError (UCM's
    pool would have no queue)."""
    global _handle
    cores = [int(c) for c, _ in param.bindInfo]
    if not cores:
        raise ValueError("SetupParam.bindInfo lists no core: the pool would have no worker")
    allowed = os.sched_getaffinity(0)
    h = _open(len(cores), [c for c in cores if c in allowed])
    with _mu:
        _handle = h
        _pools.append(h)
    return 0


def _pool():
    global _handle
    with _mu:
        if _handle == 0:
            _handle = _open(2, [])
            _pools.append(_handle)
        return _handle


def _tensor(t, dtype, what):
    """t as a C-contiguous numpy array of dtype: a view of a CPU tensor or array that already
    is one, else a copy."""
    if hasattr(t, "detach"):  # a torch tensor
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if not t.is_contiguous():
            t = t.contiguous()
        t = t.numpy()
    arr = np.asarray(t)
    if arr.dtype != dtype or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=dtype)
    return arr


def _failed(message):
    """A task that failed at submission: its id, result FAILURE, Wait -1."""
    global _next
    with _mu:
        _next += 1
        _tasks[_next] = _Task(0, 0, None, None, None, {"status": "FAILURE", "error": message})
        return _next


def AsyncRetrieveByCPU(queryGroup, blkRepre, dPrunedIndex, topK, reqId, deviceType) -> int:
    """Queues the topK blocks of blkRepre for queryGroup (module docstring); returns the
    task's id (1, 2, 3, ...). A bad call is a task that fails (FAILURE, Wait -1)."""
    global _next
    try:
        q = _tensor(queryGroup, np.float16, "queryGroup")
        r = _tensor(blkRepre, np.float16, "blkRepre")
        if q.ndim != 3:
            raise ValueError("queryGroup: %d dimensions, want 3 [x, H, d]" % q.ndim)
        if r.ndim != 4:
            raise ValueError("blkRepre: %d dimensions, want 4 [n, M, h, d']" % r.ndim)
        x, nh, d = q.shape
        n, m, h, dp = r.shape
        if h == 0 or nh % h != 0:
            raise ValueError("queryGroup's %d heads: not a multiple of blkRepre's %d KV heads" % (nh, h))
        idx = None
        if dPrunedIndex is not None:
            idx = _tensor(dPrunedIndex, np.int64, "dPrunedIndex")
            if idx.shape != (h, dp):
                raise ValueError("dPrunedIndex of shape %s: want [%d, %d] (blkRepre's KV heads, dims)" % (idx.shape, h, dp))
            if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= d):
                bad = np.argwhere((idx < 0) | (idx >= d))[0]
                raise ValueError("dPrunedIndex[%d, %d] = %d: outside [0, %d) (queryGroup's dims)"
                                 % (bad[0], bad[1], idx[bad[0], bad[1]], d))
        elif d != dp:
            raise ValueError("queryGroup's dim %d, blkRepre's %d, and no dPrunedIndex" % (d, dp))
        topk = int(topK)
        if topk < 0:
            raise ValueError("topK %d: want at least 0" % topk)
        k = min(topk, n)
    except (ValueError, TypeError) as e:
        return _failed(str(e))
    out = np.empty(max(k, 1), dtype=np.int32)
    count = np.zeros(1, dtype=np.int64)
    a = _abi.Retrieval(size=ctypes.sizeof(_abi.Retrieval), method=_abi.RM_SOFTMAX, topk=k, batch=x, dim=d,
                       q=q.ctypes.data if q.size else None, reprs=r.ctypes.data if r.size else None, n_reprs=n,
                       out_idx=out.ctypes.data, out_count=count.ctypes.data,
                       q_dtype=_abi.DTYPE_FLOAT16, r_dtype=_abi.DTYPE_FLOAT16, q_heads=nh, kv_heads=h, rows_per_block=m)
    if idx is not None:
        a.channels, a.kept = idx.ctypes.data if idx.size else None, dp
    handle = _pool()
    lib = _abi.get()
    task = lib.ucmgo_retrieve_submit(handle, ctypes.byref(a))
    if task <= 0:
        return _failed(str(_abi.error("ucmgo_retrieve_submit", task)))
    with _mu:
        _next += 1
        _tasks[_next] = _Task(handle, task, (queryGroup, blkRepre, q, r, idx), out, count, None)
        return _next


def _finish(t, wait):
    """Collects a task's result once it is done (waiting for it when wait); False when it is
    not done yet (or another call is collecting it and wait is False)."""
    if t.result is not None:
        return True
    if not t.lock.acquire(blocking=wait):
        return False
    try:
        if t.result is not None:
            return True
        lib = _abi.get()
        if not wait:
            fin = ctypes.c_int32()
            st = lib.ucmgo_retrieve_check(t.handle, t.task, ctypes.byref(fin))
            if st == 0 and not fin.value:
                return False
        st = lib.ucmgo_retrieve_release(t.handle, t.task)  # waits; ctypes releases the GIL
        if st == 0:
            result = {"status": "SUCCESS", "data": [int(v) for v in t.out[: int(t.count[0])]]}
        else:
            result = {"status": "FAILURE", "error": str(_abi.error("ucmgo_retrieve_release", st))}
        t.refs = t.out = t.count = None
        t.result = result
        return True
    finally:
        t.lock.release()


def Wait(taskId) -> int:
    """Blocks until the task is done: 0, -1 if it failed; -50003 for an id never returned or
    already waited (as UCM)."""
    with _mu:
        t = _tasks.get(taskId)
        if t is None or t.waited:
            return ENOOBJ
        t.waited = True
    _finish(t, True)
    return 0 if t.result["status"] == "SUCCESS" else -1


def GetTaskResult(taskId):
    """None for an id never returned; {"status": "PENDING"} while it runs; then
    {"status": "SUCCESS", "data": [block ids]} or {"status": "FAILURE", "error": message},
    the same every call."""
    with _mu:
        t = _tasks.get(taskId)
    if t is None:
        return None
    if not _finish(t, False):
        return {"status": "PENDING"}
    return dict(t.result)
