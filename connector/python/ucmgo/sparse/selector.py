"""Selector: sparse attention's block representations and block selection over a UcmGoStore.

    from ucmgo import UcmGoStore
    from ucmgo.sparse import Selector

    sel = Selector(store, {"ESA": {"sparse_ratio": 0.3}},
                   {"layers": 32, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "block_size": 128})
    store.wait(sel.dump_reprs(block_ids, k))          # K: [n, layers, block_size, kv_heads, head_dim]
    blocks = sel.select("req-1", layer, step, q, block_ids, seq_len)   # int32 positions, ascending

The selector is libucmgo.so's (ucmgo.h, "Sparse attention: selectors"): representations are
stored as sidecars of their blocks (they survive restarts and are seen by every instance on
the store's backends), and a selection is exactly the method's decode-time selection in the
serving engine's hooks (windows, budget, retrieval stride, lag, per-KV-head selection).
Inputs are numpy arrays or CPU torch tensors; outputs are numpy arrays.
"""

import ctypes
import json
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _lib
from ..store import UcmGoError, UcmGoStore, UcmGoTask, _ids

# Sidecar kinds (ucmgo.h UCMGO_REPR_*), by number.
KINDS = {1: "esa-mean", 2: "esa-max", 3: "quest", 4: "kvstar", 5: "hash"}

# K dtypes (ucmgo.h UCMGO_DTYPE_*).
_DT_F16, _DT_BF16, _DT_F32 = 1, 2, 5

_declared = False


def _lib_selector():
    """The library with the selector entry points declared (once)."""
    global _declared
    lib = _lib.get()
    if not _declared:
        i64, i32, sz, p = ctypes.c_int64, ctypes.c_int32, ctypes.c_size_t, ctypes.c_void_p
        cs = ctypes.c_char_p
        sel_args = [i64, cs, i32, i64, p, sz, p, sz, i64, p, sz, p, p, p]
        for name, res, args in [
            ("ucmgo_selector_open", i64, [i64, cs, cs]),
            ("ucmgo_selector_close", i32, [i64]),
            ("ucmgo_reprs_shape", i32, [i64, p, p, p, p, p]),
            ("ucmgo_reprs_dump", i64, [i64, p, sz, p, sz, i32]),
            ("ucmgo_reprs_put", i64, [i64, p, sz, p, sz]),
            ("ucmgo_reprs_load", i32, [i64, i32, p, sz, p, sz, p]),
            ("ucmgo_select_submit", i64, sel_args),
            ("ucmgo_select", i32, sel_args),
            ("ucmgo_select_check", i32, [i64, i64, p]),
            ("ucmgo_select_wait", i32, [i64, i64]),
            ("ucmgo_select_release", i32, [i64, i64]),
            ("ucmgo_selector_request_finished", i32, [i64, cs]),
            ("ucmgo_selector_retrieve_dot", i32, [i64, i32, p, sz, p, i64, i64, p, i64, i32, i32, p, p, p, p]),
        ]:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        _declared = True
    return lib


def _check(status: int) -> int:
    if status < 0:
        raise UcmGoError(status, _lib.last_error())
    return status


def _text(v) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    return json.dumps(v).encode("utf-8")


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _float32(x, what: str) -> np.ndarray:
    """x (numpy, a CPU torch tensor, or a sequence) as a C-contiguous float32 array."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise UcmGoError(_lib.EPARAM, "%s: on %s; the selector reads host memory (CPU tensors)" % (what, x.device.type))
        x = x.detach().float().contiguous().numpy()
    return np.ascontiguousarray(x, dtype=np.float32)


# A valid address for a candidate table of no entries (width 0): the library reads nothing there.
_EMPTY_CAND = np.zeros(1, dtype=np.int32)


class SelectTask:
    """A selection in flight (Selector.submit_select): its handle, and the arrays the library
    writes its outcome into (kept alive until the task is released)."""

    __slots__ = ("task_id", "blocks", "count", "heads", "head_counts", "per_head", "_keep", "released")

    def __init__(self, task_id, blocks, count, heads, head_counts, per_head, keep):
        self.task_id = task_id
        self.blocks, self.count, self.heads, self.head_counts = blocks, count, heads, head_counts
        self.per_head = per_head
        self._keep = keep
        self.released = False

    def __repr__(self):
        return "SelectTask(%d)" % self.task_id


class Selector:
    """A sparse-attention method's block selection over a store (ucmgo.h's selector).

    sparse_config is a ucm_sparse_config mapping (a dict, or YAML/JSON text) enabling one
    block-scoring method: ESA (pool mean or max; head_select kv), Quest, GSA, KVStarMultiStep,
    GSAOnDevice. shape is {"layers", "q_heads", "kv_heads", "head_dim", "block_size"}. Bad
    arguments raise UcmGoError with status EPARAM and a message naming the field.
    """

    def __init__(self, store: UcmGoStore, sparse_config: Union[Dict, str], shape: Dict[str, int]) -> None:
        self._lib = _lib_selector()
        self._store = store
        self._h = _check(self._lib.ucmgo_selector_open(store.cc_store(), _text(sparse_config), _text(shape)))
        self.shape = dict(shape)
        vals = [ctypes.c_int64() for _ in range(4)]
        kind = ctypes.c_int32()
        _check(self._lib.ucmgo_reprs_shape(self._h, *[ctypes.byref(v) for v in vals], ctypes.byref(kind)))
        self.layers, self.rows, self.heads, self.cols = (v.value for v in vals)
        self.kind = KINDS.get(kind.value, str(kind.value))

    # -- plumbing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Waits for the selections in flight and frees the selector. Idempotent."""
        h, self._h = getattr(self, "_h", 0), 0
        if h:
            _check(self._lib.ucmgo_selector_close(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finalizer must not raise
            pass

    @property
    def layer_floats(self) -> int:
        """Floats of one layer of one block's representation: rows × heads × cols."""
        return self.rows * self.heads * self.cols

    @property
    def block_floats(self) -> int:
        """Floats of one block's representation, every layer."""
        return self.layers * self.layer_floats

    # -- representations -----------------------------------------------------------------------

    def dump_reprs(self, block_ids: Sequence[bytes], k) -> UcmGoTask:
        """Computes each block's representation from its K and starts storing it as the block's
        sidecar. k is [n, layers, block_size, kv_heads, head_dim] (numpy float16/float32, or a CPU
        torch tensor of float16, bfloat16 or float32), or a list of n lists of per-layer arrays
        [block_size, kv_heads, head_dim]; it is read before the call returns. Returns a task of
        the store: store.wait(task) raises when a block failed (task.failed: a block not stored
        has no representation)."""
        n = len(block_ids)
        keep = []
        ptrs = []
        dtypes = set()
        rows = k if isinstance(k, (list, tuple)) else [k[i] for i in range(n)] if n else []
        if len(rows) != n:
            raise UcmGoError(_lib.EPARAM, "dump_reprs: %d block ids and K of %d blocks" % (n, len(rows)))
        for i, row in enumerate(rows):
            layers = row if isinstance(row, (list, tuple)) else [row[l] for l in range(row.shape[0])]
            if len(layers) != self.layers:
                raise UcmGoError(_lib.EPARAM, "dump_reprs: block at position %d: K of %d layers, the shape has %d" % (i, len(layers), self.layers))
            for l, t in enumerate(layers):
                ptr, dt, hold = self._k_pointer(t, "dump_reprs: block at position %d, layer %d" % (i, l))
                ptrs.append(ptr)
                dtypes.add(dt)
                keep.append(hold)
        if len(dtypes) > 1:
            raise UcmGoError(_lib.EPARAM, "dump_reprs: K of mixed dtypes")
        dt = dtypes.pop() if dtypes else _DT_F16
        table = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
        task = _check(self._lib.ucmgo_reprs_dump(self._h, _ids(block_ids), n, table, self.layers, dt))
        return UcmGoTask(task, n, None)

    @staticmethod
    def _k_pointer(t, what):
        if _is_torch(t):
            import torch

            if t.device.type != "cpu":
                raise UcmGoError(_lib.EPARAM, "%s: on %s; the selector reads host memory (CPU tensors)" % (what, t.device.type))
            dts = {torch.float16: _DT_F16, torch.bfloat16: _DT_BF16, torch.float32: _DT_F32}
            if t.dtype not in dts:
                raise UcmGoError(_lib.EPARAM, "%s: dtype %s; want float16, bfloat16 or float32" % (what, t.dtype))
            t = t.contiguous()
            return t.data_ptr(), dts[t.dtype], t
        a = np.asarray(t)
        dts = {np.dtype(np.float16): _DT_F16, np.dtype(np.float32): _DT_F32}
        if a.dtype not in dts:
            raise UcmGoError(_lib.EPARAM, "%s: dtype %s; want float16 or float32" % (what, a.dtype))
        a = np.ascontiguousarray(a)
        return a.ctypes.data, dts[a.dtype], a

    def put_reprs(self, block_ids: Sequence[bytes], reprs) -> UcmGoTask:
        """Starts storing precomputed representations: reprs is [n, layers, rows, heads, cols]
        (or [n, block_floats]) float32 in the layout of docs/connector.md (ESA: rows 1; Quest:
        min then max; KVStar: the kept channels then the merged rows; hash: code bytes). A block
        that already has this kind of representation keeps it. Returns a store task."""
        a = _float32(reprs, "put_reprs")
        n = len(block_ids)
        if a.size != n * self.block_floats:
            raise UcmGoError(_lib.EPARAM, "put_reprs: %d values for %d blocks of %d (layers %d × rows %d × heads %d × cols %d)" % (
                a.size, n, self.block_floats, self.layers, self.rows, self.heads, self.cols))
        task = _check(self._lib.ucmgo_reprs_put(self._h, _ids(block_ids), n, a.ctypes.data if n else None, self.block_floats))
        return UcmGoTask(task, n, None)

    def load_reprs(self, layer: int, block_ids: Sequence[bytes]) -> Tuple[np.ndarray, np.ndarray]:
        """Reads one layer's representation of each block: (values float32 [n, rows, heads, cols],
        found bool [n]). A block without one (not stored, never given one, or failing a check) is
        not found and its values are zero."""
        n = len(block_ids)
        out = np.zeros((n, self.rows, self.heads, self.cols), dtype=np.float32)
        found = np.zeros(n, dtype=np.uint8)
        _check(self._lib.ucmgo_reprs_load(self._h, int(layer), _ids(block_ids), n, out.ctypes.data if n else None,
                                          self.layer_floats, found.ctypes.data if n else None))
        return out, found.astype(bool)

    # -- retrieval over the stored representations ---------------------------------------------

    def retrieve_dot(self, layer: int, block_ids: Sequence[bytes], query, topk: int, candidates=None,
                     workers: int = 1) -> Dict[str, np.ndarray]:
        """ESA's retrieval over layer's representations of block_ids read from the store by id
        (ucmgo_selector_retrieve_dot), instead of a matrix the caller keeps: per row of query
        ([batch, heads × cols] float32, heads × cols = layer_floats, ESA's and GSA's one row per
        block) the topk blocks of largest float32 dot product, score descending, ties to the
        earlier candidate. candidates is None (every block) or [batch, width] positions into
        block_ids, -1 for none. A block without a stored representation (not stored, none
        dumped, failing its check) is no candidate. Runs on the calling thread (the GIL
        released) and up to workers - 1 helpers.

        Returns {"indices": int32 [batch, k], "scores": float32 [batch, k], "found": bool [n]}
        as UCM's RetrievalWorkerBackend.get_result does (indices are positions into block_ids; k
        = min(topk, row 0's candidates with a representation); a row with fewer is padded with
        -1 and -inf), and found[i] says whether block i had a representation. Bad arguments
        raise UcmGoError EPARAM naming the argument."""
        q = _float32(query, "retrieve_dot: query")
        if q.ndim != 2:
            raise UcmGoError(_lib.EPARAM, "retrieve_dot: query of %d dimensions: want [batch, %d]" % (q.ndim, self.layer_floats))
        batch, dim = q.shape
        topk = int(topk)
        if topk < 0 or topk >= 1 << 31:
            raise UcmGoError(_lib.EPARAM, "retrieve_dot: topk %d: want 0 ... 2^31-1" % topk)
        cand, width = None, 0
        if candidates is not None:
            c = candidates.numpy() if _is_torch(candidates) else np.asarray(candidates)
            if c.ndim != 2 or c.shape[0] != batch:
                raise UcmGoError(_lib.EPARAM, "retrieve_dot: candidates of shape %s: want [batch %d, width]" % (tuple(c.shape), batch))
            if c.size and (c.dtype.kind not in "iu" or c.min() < -1 or c.max() >= len(block_ids)):
                bad = np.argwhere((c < -1) | (c >= len(block_ids)) | (c != np.floor(c)))
                where = " (row %d, column %d)" % tuple(bad[0]) if len(bad) else ""
                raise UcmGoError(_lib.EPARAM, "retrieve_dot: candidates%s: want positions in [-1, %d) of dtype int" % (where, len(block_ids)))
            cand = np.ascontiguousarray(c, dtype=np.int32)
            width = cand.shape[1]
        n = len(block_ids)
        idx = np.empty((batch, topk), dtype=np.int32)
        scores = np.empty((batch, topk), dtype=np.float32)
        count = np.zeros(max(batch, 1), dtype=np.int64)
        found = np.zeros(max(n, 1), dtype=np.uint8)
        addr = lambda a: a.ctypes.data if a is not None and a.size else None
        cptr = addr(cand) if cand is None or cand.size else _EMPTY_CAND.ctypes.data  # a table of no entries
        _check(self._lib.ucmgo_selector_retrieve_dot(self._h, int(layer), _ids(block_ids), n, addr(q), batch, dim, cptr, width,
                                                     topk, int(workers), addr(idx), addr(scores), count.ctypes.data, found.ctypes.data))
        k = int(count[0]) if batch else 0
        if k < topk:
            idx, scores = np.ascontiguousarray(idx[:, :k]), np.ascontiguousarray(scores[:, :k])
        return {"indices": idx, "scores": scores, "found": found[:n].astype(bool)}

    # -- selection -----------------------------------------------------------------------------

    def submit_select(self, request_id: str, layer: int, step: int, q, block_ids: Sequence[bytes], seq_len: int,
                      per_head: bool = False) -> SelectTask:
        """Starts selecting the blocks decode step `step` of `layer` attends for a request: q is
        the step's queries after RoPE ([q_heads, head_dim], or [tokens, q_heads, head_dim]: the
        last token selects), block_ids the stored ids of its leading full blocks, seq_len the
        tokens attended (the context is ceil(seq_len / block_size) blocks). Selections of one
        (request, layer) run in submission order. poll, wait and result follow it."""
        args, out = self._prepare(request_id, layer, step, q, block_ids, seq_len, per_head)
        task = _check(self._lib.ucmgo_select_submit(self._h, *args))
        return SelectTask(task, *out)

    def _prepare(self, request_id, layer, step, q, block_ids, seq_len, per_head):
        """The selection's arguments after the handle, and SelectTask's fields but the id."""
        qa = _float32(q, "select: query")
        bs = int(self.shape["block_size"])
        if seq_len < 1:
            raise UcmGoError(_lib.EPARAM, "select: seq_len %d not >= 1" % seq_len)
        cap = max((int(seq_len) + bs - 1) // bs, 1)
        blocks = np.zeros(cap, dtype=np.int32)
        count = np.zeros(1, dtype=np.int64)
        heads = head_counts = None
        hp = hcp = None
        if per_head:
            heads = np.zeros((self.heads, cap), dtype=np.int32)
            head_counts = np.zeros(self.heads, dtype=np.int64)
            hp, hcp = heads.ctypes.data, head_counts.ctypes.data
        ids = _ids(block_ids)
        args = (request_id.encode("utf-8"), int(layer), int(step), qa.ctypes.data, qa.size, ids, len(block_ids), int(seq_len),
                blocks.ctypes.data, cap, count.ctypes.data, hp, hcp)
        return args, (blocks, count, heads, head_counts, per_head, (qa, ids))

    def poll(self, task: SelectTask) -> bool:
        """True once the selection is done (its outcome written), without blocking."""
        fin = ctypes.c_int32(0)
        status = self._lib.ucmgo_select_check(self._h, task.task_id, ctypes.byref(fin))
        if status < 0 and not fin.value:
            _check(status)
        return bool(fin.value)

    def wait(self, task: SelectTask) -> None:
        """Blocks until the selection is done (the GIL released); raises its error. Repeatable."""
        _check(self._lib.ucmgo_select_wait(self._h, task.task_id))

    def result(self, task: SelectTask):
        """Waits for the selection, frees its task and returns it: the attended blocks' positions
        (int32, ascending), or with per_head (blocks, [kv_heads arrays]) with each KV head's own
        selection (every head gets the blocks when the method selects per layer). A second call
        raises (ENOOBJ)."""
        if task.released:
            raise UcmGoError(_lib.ENOOBJ, "selection task %d: already taken" % task.task_id)
        st = self._lib.ucmgo_select_wait(self._h, task.task_id)
        msg = _lib.last_error() if st < 0 else ""
        _check(self._lib.ucmgo_select_release(self._h, task.task_id))
        task.released, task._keep = True, None
        if st < 0:
            raise UcmGoError(st, msg)
        return self._outcome(task.blocks, task.count, task.heads, task.head_counts, task.per_head)

    def _outcome(self, blocks, count, heads, head_counts, per_head):
        out = blocks[: int(count[0])].copy()
        if not per_head:
            return out
        return out, [heads[h, : int(head_counts[h])].copy() for h in range(self.heads)]

    def select(self, request_id: str, layer: int, step: int, q, block_ids: Sequence[bytes], seq_len: int, per_head: bool = False):
        """The blocks (and per KV head with per_head) one decode step of one layer attends, as
        submit_select then result would return them, selected on the calling thread
        (ucmgo_select)."""
        args, out = self._prepare(request_id, layer, step, q, block_ids, seq_len, per_head)
        _check(self._lib.ucmgo_select(self._h, *args))
        return self._outcome(*out[:5])

    def request_finished(self, request_id: str) -> None:
        """Forgets the request's state in the method (held selections, lag, pool references)."""
        _check(self._lib.ucmgo_selector_request_finished(self._h, request_id.encode("utf-8")))
