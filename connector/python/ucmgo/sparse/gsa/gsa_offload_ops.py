"""gsa_offload_ops: UCM's GSA offload top-k module (CalKpreAndTopk) over UCM-Go's retriever.

A drop-in for ucm.sparse.gsa.offload_ops.gsa_offload_ops (UCM's pybind11 module): swap the
import and GSA's gsa.py runs unchanged.

    from ucmgo.sparse.gsa import gsa_offload_ops
    ops = gsa_offload_ops.CalKpreAndTopk(layers, block_size, max_bs, q_heads, head_size)
    ops.set_kpre_method_param(kv_heads, 1)
    ops.set_kpre_cache(kpre_caches)          # per layer float32 [slots, 1, kv_heads, head_size]
    # per step:
    ops.set_common_param(cal_topk_idx, is_decode)
    ops.set_topk_param(repre_slot_mapping)   # per request: its representation slots
    ops.set_topk_cache(topk_caches, topk_lens)
    # per layer:
    ops.add_copy_req(False, layer, locations, q)   # copies q's rows, selects this layer's blocks
    ops.is_calculate_finish()                # True once every layer's selection is written

The selection (UCMGO_RM_MAXDOT, docs/connector.md "Sparse retrieval"): for the j-th decode
request i, the query q_cache[layer][cal_topk_idx[j]] averaged per KV head group; its blocks
are the kpre rows repre_slot_mapping[i][0], +1, ... (len(repre_slot_mapping[i]) of them, as
UCM reads them); each scores Σ_h max_m q̄_h·kpre[block][h][m]; topk_caches[layer][i] receives
UCM's order for k = topk_lens[j]: positions 0, n-2, n-1, then the k-3 best of those between
(score descending, ties to the earlier), or 0 … n-1 when k >= n or n <= 3; nothing when k or n
is 0. The rest of the row is left as it was.

Same as UCM: constructor, the k_cache and q_cache attributes (q_cache: per layer float32
zeros [maxBs, numHeads, headSize], torch tensors when torch is installed), every method and
its arguments; add_copy_req copies source row i to q_cache[layer][i] for each location i that
is not -1; the decode queries' q_cache rows are replaced by their group means as UCM's module
does (the first kv_heads rows of each, when q_heads != kv_heads); topk_caches and kpre_caches
are written and read in place; a step's selection needs set_topk_param again, as UCM's flag
resets after every step; when add_copy_req(True, ...) marked layer 0, each layer waits for
its own add_copy_req(True, layer, [], k) (the k representations written) before it is
selected. The k-representation computation stays the caller's (UCM's is commented out:
gsa.py writes the kpre rows).

Where UCM's behaviour is a race or undefined, this module says what happens instead:
- is_calculate_finish() is False from a step's first layer-0 request until every layer's
  selection is written (UCM's is True until its copy thread reaches the request);
- each layer's selection is a task on a pool of 2 threads, queued as soon as its query (and,
  when asked, its representations) are there, in layer order;
- a selection longer than its topk_caches row, a block past kpre_caches[layer], a topk or
  kpre cache that is not a contiguous int32 (float32) CPU tensor raise ValueError at
  add_copy_req (UCM writes or reads past them);
- a task's failure raises RuntimeError from is_calculate_finish.
"""

import ctypes
import threading

import numpy as np

from .. import _abi

__all__ = ["CalKpreAndTopk"]

# UCM's TopkBlockSelector windows (SetWindowSize is not bound: always these).
_INIT, _LOCAL = 1, 2


def _view(t, dtype, what):
    """A numpy view of a contiguous CPU tensor or array of dtype (ValueError otherwise: the
    module writes or reads it in place)."""
    arr = t.detach().numpy() if hasattr(t, "detach") else t
    if not isinstance(arr, np.ndarray) or arr.dtype != dtype or not arr.flags.c_contiguous:
        raise ValueError("%s: want a C-contiguous %s CPU tensor or array" % (what, np.dtype(dtype).name))
    return arr


class CalKpreAndTopk:
    """UCM's CalKpreAndTopk(layerNum, blockSize, maxBs, numHeads, headSize) (module docstring)."""

    def __init__(self, layerNum, blockSize, maxBs, numHeads, headSize):
        self._layers, self._block_size = int(layerNum), int(blockSize)
        self._q_heads, self._head_size = int(numHeads), int(headSize)
        if self._layers < 1 or self._q_heads < 1 or self._head_size < 1 or int(maxBs) < 0:
            raise ValueError("CalKpreAndTopk(%d, %d, %d, %d, %d): want layers, heads and head size >= 1"
                             % (layerNum, blockSize, maxBs, numHeads, headSize))
        try:
            import torch

            self.q_cache = [torch.zeros((int(maxBs), self._q_heads, self._head_size), dtype=torch.float32)
                            for _ in range(self._layers)]
        except ImportError:
            self.q_cache = [np.zeros((int(maxBs), self._q_heads, self._head_size), dtype=np.float32)
                            for _ in range(self._layers)]
        self.k_cache = []
        self._kv_heads, self._num_kpre = self._q_heads, 1
        self._kpre = None
        self._topk, self._topk_lens = None, []
        self._cal_topk_idx, self._is_decode = [], []
        self._mapping, self._need_topk = [], False
        self._calc_block_table, self._calc_mapping = None, []
        self._gen, self._views = 0, {}  # the setters' generation (see _plan); views by layer
        self._mu = threading.Lock()
        self._round = None  # the step being selected: see _start
        lib = _abi.get()
        h = lib.ucmgo_retriever_new(2, None, 0)
        if h <= 0:
            raise _abi.error("ucmgo_retriever_new", h)
        self._lib, self._h = lib, h

    # UCM's setters: recorded for the next selections.
    def set_kpre_method_param(self, kNumHeads, numKpre):
        """The KV heads and representation rows per block and head (gsa.py: kv_heads, 1)."""
        self._gen += 1
        self._kv_heads, self._num_kpre = int(kNumHeads), int(numKpre)

    def set_kpre_cache(self, kpreCache):
        """The per-layer representation caches, float32 [slots, numKpre, kv_heads, headSize],
        read as [slots][kv_heads][numKpre][headSize] (as UCM; the same bytes when numKpre is 1)."""
        self._gen += 1
        self._kpre = list(kpreCache)

    def set_topk_cache(self, topkCache, topkLens):
        """The per-layer int32 [bs, width] outputs, and each decode request's selection length."""
        self._gen += 1
        self._topk = list(topkCache)
        self._topk_lens = [int(k) for k in topkLens]

    def set_common_param(self, calTopkIdx, isDecode):
        """The q_cache row of each decode request, and which requests decode."""
        self._gen += 1
        self._cal_topk_idx = [int(i) for i in calTopkIdx]
        self._is_decode = [bool(d) for d in isDecode]

    def set_topk_param(self, repreSlotMapping):
        """Each request's representation slots; the next step's layers are selected."""
        self._gen += 1
        # UCM reads a request's first slot and the count (the slots are taken as a run).
        self._mapping = [(int(m[0]), len(m)) if len(m) else (0, 0) for m in repreSlotMapping]
        self._need_topk = True

    def set_kpre_param(self, calcKpreBlockTable, calcRepreSlotMapping):
        """Recorded, as UCM records them (its k-representation computation is commented out)."""
        self._calc_block_table, self._calc_mapping = calcKpreBlockTable, [int(s) for s in calcRepreSlotMapping]

    def set_kpre_data_ready(self, layerIdx) -> bool:
        """Layer layerIdx's representations are written (what add_copy_req(True, layer, [], k)
        does); True."""
        self._k_ready(int(layerIdx))
        return True

    def set_topk_data_ready(self, layerIdx):
        """Layer layerIdx's queries are in q_cache (what add_copy_req with locations does)."""
        self._q_ready(int(layerIdx), None)

    def add_copy_req(self, needCalKpre, layerIdx, locations, npuTensor):
        """With locations: copies npuTensor[i] to q_cache[layer][i] where locations[i] != -1,
        then the layer's queries are ready (and, at layer 0, needCalKpre says whether each layer
        also waits for its representations). Without: the layer's representations are ready."""
        layer = int(layerIdx)
        if not 0 <= layer < self._layers:
            raise ValueError("layerIdx %d: outside [0, %d)" % (layer, self._layers))
        locations = list(locations)
        if not locations:
            self._k_ready(layer)
            return
        dst = self.q_cache[layer]
        src = npuTensor
        for i, loc in enumerate(locations):
            if loc == -1:
                continue
            if hasattr(dst, "copy_"):
                dst[i].copy_(src[i])
            else:
                dst[i] = np.asarray(src[i], dtype=np.float32)
        self._q_ready(layer, bool(needCalKpre))

    def is_calculate_finish(self) -> bool:
        """True when no step is being selected: every layer of the last one written."""
        with self._mu:
            r = self._round
        if r is None:
            return True
        with r["lock"]:
            if r["handled"] < self._layers:
                return False
            fin = ctypes.c_int32()
            for task in r["tasks"]:
                st = self._lib.ucmgo_retrieve_check(self._h, task, ctypes.byref(fin))
                if st != 0 or not fin.value:
                    if st != 0:
                        raise _abi.error("ucmgo_retrieve_check", st)
                    return False
            tasks, r["tasks"] = r["tasks"], []
            errors = [st for st in (self._lib.ucmgo_retrieve_release(self._h, t) for t in tasks) if st != 0]
            r["refs"] = []
        with self._mu:
            if self._round is r:
                self._round = None
        if errors:
            raise _abi.error("ucmgo_retrieve_release", errors[0])
        return True

    # The step's state machine: UCM's flags, without its threads.
    def _start(self, need_pre):
        """A step starts at its first layer-0 request."""
        with self._mu:
            old = self._round
            if old is None or old["handled"] >= self._layers:
                r = {"lock": threading.Lock(), "need_topk": self._need_topk, "need_pre": need_pre,
                     "q": set(), "k": set(), "next": 0, "handled": 0, "tasks": [], "refs": []}
                if old is not None:  # the last step's tasks, not yet seen done: this step's too
                    with old["lock"]:
                        r["tasks"], r["refs"] = old["tasks"], old["refs"]
                self._round = r
                self._need_topk = False  # UCM's ResetReady: the next step needs set_topk_param
            elif need_pre:
                old["need_pre"] = True
            return self._round

    def _q_ready(self, layer, need_pre):
        r = self._start(bool(need_pre)) if layer == 0 else self._round
        if r is None:
            return
        with r["lock"]:
            r["q"].add(layer)
            self._advance(r)

    def _k_ready(self, layer):
        r = self._start(True) if layer == 0 else self._round
        if r is None:
            return
        with r["lock"]:
            r["k"].add(layer)
            self._advance(r)

    def _advance(self, r):
        """Selects the step's layers, in order, whose inputs are there (r's lock held)."""
        while r["next"] < self._layers:
            layer = r["next"]
            if r["need_topk"] and layer not in r["q"]:
                return
            if r["need_pre"] and layer not in r["k"]:
                return
            if not r["need_topk"] and not r["need_pre"] and layer != 0 and 0 not in r["q"]:
                return
            if r["need_topk"]:
                self._select(r, layer)
            r["next"] += 1
            r["handled"] += 1

    def _select(self, r, layer):
        """Queues layer's selections: one retrieval per run of consecutive decode requests."""
        plan = self._plan(r)
        if not plan["runs"]:
            return
        kpre, kpre_t = self._cached_view(self._kpre, layer, np.float32, "kpre_caches")
        out, out_t = self._cached_view(self._topk, layer, np.int32, "topk_caches")
        if out.ndim != 2:
            raise ValueError("topk_caches[%d]: %d dimensions, want 2 [bs, width]" % (layer, out.ndim))
        per = self._kv_heads * self._num_kpre * self._head_size
        if kpre.size % per:
            raise ValueError("kpre_caches[%d]: %d values, not whole slots of %d" % (layer, kpre.size, per))
        slots = kpre.size // per
        q, _ = self._cached_view(self.q_cache, layer, np.float32, "q_cache")
        kv, g, d = self._kv_heads, plan["g"], self._head_size
        for run in plan["runs"]:
            if run["end"] > slots:
                b = run["end_row"]
                raise ValueError("repre_slot_mapping[%d]: slots %d … %d: outside kpre_caches[%d]'s %d"
                                 % (b, self._mapping[b][0], run["end"] - 1, layer, slots))
            if run["last"] >= out.shape[0]:
                raise ValueError("decode request %d: topk_caches[%d] has %d rows" % (run["last"], layer, out.shape[0]))
            # The group means, as UCM's module computes them: the g query heads of each KV
            # head summed in order, then times float32(1/g). The retrieval gets the means (one
            # query head per KV head: its own mean is the identity).
            x = q[run["qrows"]].reshape(len(run["qrows"]), kv, g, d)
            m = x[:, :, 0].copy()
            for k in range(1, g):
                m += x[:, :, k]
            if g > 1:
                m *= plan["inv"]
            a = run["args"]
            a.q, a.reprs, a.n_reprs = m.ctypes.data, kpre.ctypes.data, slots
            a.out_idx, a.topk = out[run["first"]:].ctypes.data, out.shape[1]
            task = self._lib.ucmgo_retrieve_submit(self._h, ctypes.byref(a))
            if task <= 0:
                raise ValueError(str(_abi.error("ucmgo_retrieve_submit", task)))
            r["tasks"].append(task)
            r["refs"].append((kpre, out, kpre_t, out_t))  # read and written until the task is done
            # UCM's module leaves the decode queries' group means in q_cache (row h of each:
            # KV head h's mean) for the requests it selects for.
            if g > 1:
                for b, row in run["means"]:
                    q[row, :kv] = m[b]

    def _plan(self, r):
        """The step's decode requests in runs, with what each run's retrieval takes that does
        not change from layer to layer; made again when a setter was called since."""
        plan = r.get("plan")
        if plan is not None and plan["gen"] == self._gen:
            return plan
        decode = [i for i, d in enumerate(self._is_decode) if d]
        if len(decode) > len(self._cal_topk_idx) or len(decode) > len(self._topk_lens):
            raise ValueError("%d decode requests, %d cal_topk_idx and %d topk_lens"
                             % (len(decode), len(self._cal_topk_idx), len(self._topk_lens)))
        if decode and (self._kpre is None or self._topk is None):
            raise ValueError("set_kpre_cache and set_topk_cache come before a selection")
        kv = self._kv_heads
        g = self._q_heads // kv if kv > 0 else 0
        if decode and (g < 1 or g * kv != self._q_heads):
            raise ValueError("%d query heads over %d KV heads: want a whole number of query heads per KV head"
                             % (self._q_heads, kv))
        runs, start = [], 0
        for j in range(1, len(decode) + 1):
            if j < len(decode) and decode[j] == decode[j - 1] + 1:
                continue
            rows = decode[start:j]
            maps = [self._mapping[i] if i < len(self._mapping) else (0, 0) for i in rows]  # (first, count)
            width = max([c for _, c in maps] + [0])
            cand = np.full((len(rows), width), -1, dtype=np.int32)
            end, end_row = 0, rows[0]
            for b, (first, count) in enumerate(maps):
                if count:
                    if first < 0:
                        raise ValueError("repre_slot_mapping[%d]: slot %d" % (rows[b], first))
                    cand[b, :count] = np.arange(first, first + count, dtype=np.int32)
                    if first + count > end:
                        end, end_row = first + count, rows[b]
            topk = np.asarray(self._topk_lens[start:j], dtype=np.int32)
            a = _abi.Retrieval(size=ctypes.sizeof(_abi.Retrieval), method=_abi.RM_MAXDOT, batch=len(rows),
                               dim=self._head_size, cand=cand.ctypes.data if cand.size else _EMPTY_ADDR,
                               cand_width=width, q_heads=kv, kv_heads=kv, rows_per_block=self._num_kpre,
                               row_topk=topk.ctypes.data, init=_INIT, local=_LOCAL)
            runs.append({"args": a, "keep": (cand, topk), "first": rows[0], "last": rows[-1], "end": end,
                         "end_row": end_row, "qrows": np.asarray(self._cal_topk_idx[start:j], dtype=np.intp),
                         "means": [(b, self._cal_topk_idx[start + b]) for b, (_, count) in enumerate(maps)
                                   if count and self._topk_lens[start + b] > 0]})
            start = j
        plan = {"gen": self._gen, "runs": runs, "g": g, "inv": np.float32(1) / np.float32(max(g, 1))}
        r["plan"] = plan
        return plan

    def _cached_view(self, tensors, layer, dtype, what):
        """tensors[layer] as a numpy view (_view), remembered for as long as it is the same
        object (and returned with it, to be kept while a task uses it)."""
        t = tensors[layer]
        # A torch tensor can be given new storage in place (resize_, set_): its address, shape
        # and strides say whether the view still shows it.
        key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype) if hasattr(t, "data_ptr") else None
        hit = self._views.get((what, layer))
        if hit is not None and hit[0] is t and hit[1] == key:
            return hit[2], t
        v = _view(t, dtype, "%s[%d]" % (what, layer))
        self._views[(what, layer)] = (t, key, v)
        return v, t

    def __del__(self):
        h, self._h = getattr(self, "_h", 0), 0
        if h > 0:
            self._lib.ucmgo_retriever_free(h)


# A valid address for an empty candidate table (width 0): the library reads nothing there.
_EMPTY = np.zeros(1, dtype=np.int32)
_EMPTY_ADDR = _EMPTY.ctypes.data
