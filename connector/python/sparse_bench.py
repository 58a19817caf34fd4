#!/usr/bin/python3
"""UCM's sparse CPU modules through Python against UCM-Go's drop-ins, in one process, on the same
inputs: ESA's RetrievalWorkerBackend, KVStar's kvstar_retrieve and GSA's CalKpreAndTopk (built
from UCM's source by /work/shared/tools/ucm-sparse-ref/build.sh, outside this repository)
against ucmgo.sparse.esa.retrieval_backend, ucmgo.sparse.kvstar.kvstar_retrieve and
ucmgo.sparse.gsa.gsa_offload_ops.

    make lib && /work/shared/tools/ucm-sparse-ref/build.sh
    UCM_SPARSE_REF=/tmp/ucm-sparse-ref/lib /usr/bin/python3 connector/python/sparse_bench.py

Cases: UCM's demo size (25,600 rows x 1,024 float32, batch 2, top 3,000 of 8,000 candidates per
row), the same with 8 requests in flight, and 1,024 blocks x 4,096 dims (32 KV heads x 128;
every block a candidate, top 307) at batch 1 and 2; 1024x4096-store is batch 1 with a third
module, StoreRetrievalBackend, reading the same rows from a store (in a temporary directory) by
block id at each request; its results must equal the matrix form's. Both modules get two workers ({0: [0, 1]}).
A call is submit -> wait -> get_result through Python (in flight: 8 submits, then 8 waits and
results, per request). Rounds alternate the modules (which one goes first alternates too);
each round times --calls calls of each; the figures are medians over rounds of per-call wall
time and process CPU time (getrusage: every thread of the process), with the range of the
wall times. The copy floor is np.copyto of the bytes one call's candidates read (one thread):
what moving them through memory once costs on this machine. speedup = UCM's wall / ours.

KVStar (kvstar-1024): 1,024 blocks of 128 tokens merged by 4 (M 32 rows), 8 KV heads of 64
kept dims (dPrunedIndex) under 32 query heads of 128, one query token, top 307; a call is
AsyncRetrieveByCPU -> Wait -> GetTaskResult; both pools have two workers (bindInfo cores 0, 1).
GSA (gsa-1024): 32 layers, one decode request over 1,024 kpre slots of 8 KV heads x 128, 32
query heads, top 307; a call is one decode step: set_topk_param, set_topk_cache, 32
add_copy_req, then polling until the last layer's row is written and is_calculate_finish()
(UCM's says True before its copy thread has begun, so the row is the signal for both). UCM's
module scores blocks with 16 OpenMP threads (its fixed OMP_THREAD_NUM); ours with 2 workers.
The copy floor is the bytes a call reads (the representations of every block, once).
"""

import argparse
import ctypes
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
os.environ.setdefault("UCMGO_LIB", str(REPO / "lib" / "libucmgo.so"))

from ucmgo.sparse.esa.retrieval_backend import RetrievalWorkerBackend as Ours  # noqa: E402


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn, calls, per):
    """Per-request wall and CPU seconds of calls runs of fn (each doing per requests)."""
    w0, c0 = time.perf_counter(), cpu()
    for _ in range(calls):
        fn()
    n = calls * per
    return (time.perf_counter() - w0) / n, (cpu() - c0) / n


def one_call(be, query, topk, idx):
    def fn():
        rid = be.submit(query, topk, idx)
        be.wait(rid)
        be.get_result(rid)
    return fn


def in_flight(be, query, topk, idx, n):
    def fn():
        ids = [be.submit(query, topk, idx) for _ in range(n)]
        for rid in ids:
            be.wait(rid)
            be.get_result(rid)
    return fn


def case(name, rows, dim, batch, topk, idx, flight, rounds, calls, ucm_cls, rng):
    data = rng.random((rows, dim), dtype=np.float32)  # UCM's demo data (torch.rand)
    query = rng.random((batch, dim), dtype=np.float32)
    mods = {"ucm": ucm_cls(data, {0: [0, 1]}), "ucmgo": Ours(data, {0: [0, 1]})}
    # The same answer first (set per row: float sums in different orders may swap near ties).
    res = {}
    for k, be in mods.items():
        rid = be.submit(query, topk, idx)
        be.wait(rid)
        res[k] = be.get_result(rid)["indices"]
    same = sum(len(set(a.tolist()) ^ set(b.tolist())) // 2 for a, b in zip(res["ucm"], res["ucmgo"]))
    fns = {k: (in_flight(be, query, topk, idx, flight) if flight > 1 else one_call(be, query, topk, idx)) for k, be in mods.items()}
    per = max(flight, 1)
    for fn in fns.values():  # warm
        fn()
    touched = np.unique(idx[idx >= 0])
    src = data[touched] if touched.size < rows else data
    dst = np.empty_like(src)
    np.copyto(dst, src)  # faults the destination in
    wall = {k: [] for k in fns}
    cpus = {k: [] for k in fns}
    floor = []
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for k in order:
            w, c = timed(fns[k], calls, per)
            wall[k].append(w)
            cpus[k].append(c)
        t0 = time.perf_counter()
        np.copyto(dst, src)
        floor.append(time.perf_counter() - t0)
    out = {"case": name, "rows": rows, "dim": dim, "batch": batch, "topk": topk,
           "candidates": int((idx >= 0).sum()), "in_flight": per, "rounds": rounds, "calls": calls,
           "set_differences": same, "read_mib": round(batch * idx.shape[1] * dim * 4 / 2**20, 1),
           
           "copy_floor_ms": round(statistics.median(floor) * 1e3, 3), "copy_mib": round(src.nbytes / 2**20, 1)}
    for k in fns:
        out[k + "_wall_ms"] = round(statistics.median(wall[k]) * 1e3, 3)
        out[k + "_wall_range_ms"] = [round(min(wall[k]) * 1e3, 3), round(max(wall[k]) * 1e3, 3)]
        out[k + "_cpu_ms"] = round(statistics.median(cpus[k]) * 1e3, 3)
    out["speedup"] = round(out["ucm_wall_ms"] / out["ucmgo_wall_ms"], 2)
    for be in mods.values():
        if hasattr(be, "close"):
            be.close()
    return out


def store_case(rounds, calls, ucm_cls, rng):
    """1,024 blocks x 4,096 dims (32 KV heads x 128), batch 1, top 307 of every block, in three
    forms: UCM's module and ours over the matrix the caller keeps, and StoreRetrievalBackend
    reading the same representations from a store by block id at each request (an ESA
    Selector's sidecars, put precomputed: values exact in float16, so the rows are equal)."""
    import tempfile

    import torch

    from ucmgo import UcmGoStore
    from ucmgo.sparse import Selector
    from ucmgo.sparse.esa.retrieval_backend import StoreRetrievalBackend
    blocks, kv, hd, topk = 1024, 32, 128, 307
    tmp = tempfile.mkdtemp(prefix="sparse-bench-store-")
    store = UcmGoStore({"storage_backends": tmp, "device_id": 0, "tensor_size_list": [4096, 4096], "shard_size": 8192,
                        "block_size": 8192, "sync_policy": "none"})
    sel = Selector(store, {"ESA": {"sparse_ratio": 0.3}}, {"layers": 1, "q_heads": kv, "kv_heads": kv, "head_dim": hd, "block_size": 128})
    ids = [os.urandom(16) for _ in range(blocks)]
    body = torch.zeros(8192, dtype=torch.uint8)
    data = rng.random((blocks, kv * hd), dtype=np.float32).astype(np.float16).astype(np.float32)
    for lo in range(0, blocks, 256):
        part = ids[lo:lo + 256]
        store.wait(store.dump(part, [0] * len(part), [[body] for _ in part]))
        store.wait(sel.put_reprs(part, data[lo:lo + 256]))
    query = rng.random((1, kv * hd), dtype=np.float32)
    idx = np.arange(blocks, dtype=np.int32).reshape(1, -1)
    mods = {"ucm": ucm_cls(data, {0: [0, 1]}), "ucmgo": Ours(data, {0: [0, 1]}),
            "store": StoreRetrievalBackend(sel, 0, ids, {0: [0, 1]})}
    res = {}
    for k, be in mods.items():
        rid = be.submit(query, topk, idx)
        be.wait(rid)
        res[k] = be.get_result(rid)
    if not (np.array_equal(res["store"]["indices"], res["ucmgo"]["indices"]) and
            res["store"]["scores"].tobytes() == res["ucmgo"]["scores"].tobytes()):
        raise SystemExit("store form: results differ from the matrix form's")
    fns = {k: one_call(be, query, topk, idx) for k, be in mods.items()}
    out = measure("1024x4096 b1, store", fns, rounds, calls, data,
                  set_differences(res["ucm"]["indices"][0].tolist(), res["store"]["indices"][0].tolist()),
                  {"blocks": blocks, "dim": kv * hd, "batch": 1, "topk": topk})
    out["store_over_matrix"] = round(out["store_wall_ms"] / out["ucmgo_wall_ms"], 1)
    for be in mods.values():
        if hasattr(be, "close"):
            be.close()
    sel.close()
    store.close()
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def set_differences(a, b):
    return len(set(a) ^ set(b)) // 2


def kvstar_case(rounds, calls, ref):
    import torch

    import kvstar_retrieve as ucm_kv  # UCM's, built outside the repository
    from ucmgo.sparse.kvstar import kvstar_retrieve as ours_kv
    mods = {"ucm": ucm_kv, "ucmgo": ours_kv}
    for m in mods.values():
        m.Setup(m.SetupParam(cpuNumaIds=[0], bindInfo=[(0, 0), (1, 0)], deviceType=m.CPU, totalTpSize=1, localRankId=0))
    gen = torch.Generator().manual_seed(0)
    n, bm, h, dp, nh, d, x, k = 1024, 32, 8, 64, 32, 128, 1, 307
    q = torch.randn(x, nh, d, generator=gen).half()
    r = torch.randn(n, bm, h, dp, generator=gen).half()
    idx = torch.stack([torch.randperm(d, generator=gen)[:dp] for _ in range(h)]).long().contiguous()

    def call(m):
        def fn():
            t = m.AsyncRetrieveByCPU(q, r, idx, k, 1, m.CPU)
            m.Wait(t)
            return m.GetTaskResult(t)["data"]
        return fn
    fns = {name: call(m) for name, m in mods.items()}
    diff = set_differences(fns["ucm"](), fns["ucmgo"]())
    return measure("kvstar 1024", fns, rounds, calls, r.numpy(), diff,
                   {"blocks": n, "rows_per_block": bm, "kv_heads": h, "kept": dp, "q_heads": nh, "dim": d, "tokens": x, "topk": k})


def gsa_case(rounds, calls, ref):
    import torch

    import gsa_offload_ops as ucm_gsa  # UCM's, built outside the repository
    from ucmgo.sparse.gsa import gsa_offload_ops as ours_gsa
    layers, n, kvh, nh, d, k, maxbs = 32, 1024, 8, 32, 128, 307, 4
    gen = torch.Generator().manual_seed(1)
    kpre = [torch.randn(n, 1, kvh, d, generator=gen) for _ in range(layers)]
    q = torch.randn(layers, maxbs, nh, d, generator=gen)
    keep = []

    def step(mod):
        op = mod.CalKpreAndTopk(layers, 128, maxbs, nh, d)
        keep.append(op)  # UCM's destructor never returns: both kept for the process's life
        op.set_kpre_method_param(kvh, 1)
        op.set_kpre_cache(kpre)
        topk = [torch.zeros((maxbs, n), dtype=torch.int32) for _ in range(layers)]
        last = topk[-1][0]

        def fn():
            last[k - 1] = -7
            op.set_common_param([0], [True])
            op.set_topk_param([list(range(n))])
            op.set_topk_cache(topk, [k])
            for layer in range(layers):
                op.add_copy_req(False, layer, [0], q[layer])
            while int(last[k - 1]) == -7 or not op.is_calculate_finish():
                pass
            return topk[0][0, :k].tolist()
        return fn
    fns = {"ucm": step(ucm_gsa), "ucmgo": step(ours_gsa)}
    diff = set_differences(fns["ucm"](), fns["ucmgo"]())
    # The read floor: UCM-Go's own best path over the same 128 MiB, once. One ESA retrieval
    # (ucmgo's RetrievalWorkerBackend, two workers) scores the 32 x 1,024 blocks of every layer
    # as rows of 1,024 floats (the copies kpre_rows holds; the step reads kpre itself).
    kpre_rows = torch.stack(kpre).reshape(layers * n, kvh * d).numpy().copy()
    reader = Ours(kpre_rows, {0: [0, 1]})
    rq = np.ones((1, kvh * d), dtype=np.float32)
    ridx = np.arange(layers * n, dtype=np.int32).reshape(1, -1)

    def read():
        reader.wait(reader.submit(rq, 1, ridx))
    out = measure("gsa 32 layers", fns, rounds, calls, torch.stack(kpre).numpy(), diff,
                  {"layers": layers, "blocks": n, "kv_heads": kvh, "q_heads": nh, "dim": d, "topk": k}, read)
    out["ucm_over_read"] = round(out["ucm_wall_ms"] / out["read_floor_ms"], 2)
    out["ucmgo_over_read"] = round(out["ucmgo_wall_ms"] / out["read_floor_ms"], 2)
    for op in keep:  # UCM's destructor never returns: its objects are never freed
        if not isinstance(op, ours_gsa.CalKpreAndTopk):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(op))
    return out


def measure(name, fns, rounds, calls, src, diff, shape, read=None):
    """Interleaved rounds of calls of each fn (the order alternating); medians over rounds. read,
    when given, is timed once a round too (read_floor_ms)."""
    for fn in fns.values():  # warm
        fn()
    dst = np.empty_like(src)
    np.copyto(dst, src)
    wall = {k: [] for k in fns}
    cpus = {k: [] for k in fns}
    floor, reads = [], []
    for r in range(rounds):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            w, c = timed(fns[k], calls, 1)
            wall[k].append(w)
            cpus[k].append(c)
        t0 = time.perf_counter()
        np.copyto(dst, src)
        floor.append(time.perf_counter() - t0)
        if read is not None:
            reads.append(timed(read, calls, 1)[0])
    out = {"case": name, **shape, "rounds": rounds, "calls": calls, "set_differences": diff,
           "copy_floor_ms": round(statistics.median(floor) * 1e3, 3), "copy_mib": round(src.nbytes / 2**20, 1)}
    if read is not None:
        out["read_floor_ms"] = round(statistics.median(reads) * 1e3, 3)
    for k in fns:
        out[k + "_wall_ms"] = round(statistics.median(wall[k]) * 1e3, 3)
        out[k + "_wall_range_ms"] = [round(min(wall[k]) * 1e3, 3), round(max(wall[k]) * 1e3, 3)]
        out[k + "_cpu_ms"] = round(statistics.median(cpus[k]) * 1e3, 3)
    out["speedup"] = round(out["ucm_wall_ms"] / out["ucmgo_wall_ms"], 2)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default=os.environ.get("UCM_SPARSE_REF", "/tmp/ucm-sparse-ref/lib"),
                    help="the directory of UCM's built retrieval_backend (ucm-sparse-ref)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5, help="calls of each module per round (x4 at 1,024 rows)")
    ap.add_argument("--cases", default="demo,demo-inflight8,1024x4096-b1,1024x4096-b2,1024x4096-store,kvstar-1024,gsa-1024")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    if any(c.startswith(("kvstar", "gsa")) for c in args.cases.split(",")):
        import torch  # noqa: F401  (UCM's KVStar and GSA modules need libtorch_python loaded)
    sys.path.insert(0, args.ref)
    import retrieval_backend  # UCM's, built outside the repository
    rng = np.random.default_rng(0)
    demo_idx = np.arange(16000, dtype=np.int32).reshape(2, -1)
    cases = {
        "demo": lambda: case("demo", 25600, 1024, 2, 3000, demo_idx, 1, args.rounds, args.calls, retrieval_backend.RetrievalWorkerBackend, rng),
        "demo-inflight8": lambda: case("demo, 8 in flight", 25600, 1024, 2, 3000, demo_idx, 8, args.rounds, max(args.calls // 4, 1),
                                       retrieval_backend.RetrievalWorkerBackend, rng),
        "1024x4096-b1": lambda: case("1024x4096 b1", 1024, 4096, 1, 307, np.arange(1024, dtype=np.int32).reshape(1, -1), 1,
                                     args.rounds, 4 * args.calls, retrieval_backend.RetrievalWorkerBackend, rng),
        "1024x4096-b2": lambda: case("1024x4096 b2", 1024, 4096, 2, 307, np.tile(np.arange(1024, dtype=np.int32), (2, 1)), 1,
                                     args.rounds, 4 * args.calls, retrieval_backend.RetrievalWorkerBackend, rng),
        "1024x4096-store": lambda: store_case(args.rounds, 4 * args.calls, retrieval_backend.RetrievalWorkerBackend, rng),
        "kvstar-1024": lambda: kvstar_case(args.rounds, 4 * args.calls, args.ref),
        "gsa-1024": lambda: gsa_case(args.rounds, args.calls, args.ref),
    }
    results = []
    print("%-18s %10s %10s %10s %10s %8s %10s %5s" % ("case", "ucm ms", "ucmgo ms", "ucm cpu", "ucmgo cpu", "speedup", "copy ms", "diff"))
    for name in args.cases.split(","):
        r = cases[name]()
        results.append(r)
        print("%-18s %10.3f %10.3f %10.3f %10.3f %7.2fx %10.3f %5d" % (r["case"], r["ucm_wall_ms"], r["ucmgo_wall_ms"], r["ucm_cpu_ms"],
                                                                     r["ucmgo_cpu_ms"], r["speedup"], r["copy_floor_ms"], r["set_differences"]),
              flush=True)
        if "store_wall_ms" in r:
            print("%-18s %10s %10.3f %10s %10.3f %7.1fx of the matrix form's wall" % ("  store form", "", r["store_wall_ms"], "",
                                                                                 r["store_cpu_ms"], r["store_over_matrix"]), flush=True)
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    sys.stdout.flush()
    os._exit(0)  # UCM's GSA module's destructor never returns: no interpreter teardown


if __name__ == "__main__":
    main()
