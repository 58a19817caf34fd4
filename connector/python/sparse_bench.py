#!/usr/bin/python3
"""ESA's CPU retrieval through Python: UCM's RetrievalWorkerBackend (built from UCM's source by
/work/shared/tools/ucm-sparse-ref/build.sh, outside this repository) against UCM-Go's drop-in
(ucmgo.sparse.esa.retrieval_backend), in one process, on the same inputs.

    make lib && /work/shared/tools/ucm-sparse-ref/build.sh
    UCM_SPARSE_REF=/tmp/ucm-sparse-ref/lib /usr/bin/python3 connector/python/sparse_bench.py

Cases: UCM's demo size (25,600 rows x 1,024 float32, batch 2, top 3,000 of 8,000 candidates per
row), the same with 8 requests in flight, and 1,024 blocks x 4,096 dims (32 KV heads x 128;
every block a candidate, top 307) at batch 1 and 2. Both modules get two workers ({0: [0, 1]}).
A call is submit -> wait -> get_result through Python (in flight: 8 submits, then 8 waits and
results, per request). Rounds alternate the modules (which one goes first alternates too);
each round times --calls calls of each; the figures are medians over rounds of per-call wall
time and process CPU time (getrusage: every thread of the process), with the range of the
wall times. The copy floor is np.copyto of the bytes one call's candidates read (one thread):
what moving them through memory once costs on this machine. speedup = UCM's wall / ours.
"""

import argparse
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default=os.environ.get("UCM_SPARSE_REF", "/tmp/ucm-sparse-ref/lib"),
                    help="the directory of UCM's built retrieval_backend (ucm-sparse-ref)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5, help="calls of each module per round (x4 at 1,024 rows)")
    ap.add_argument("--cases", default="demo,demo-inflight8,1024x4096-b1,1024x4096-b2")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    sys.path.insert(0, args.ref)
    import retrieval_backend  # UCM's, built outside the repository
    sys.path.remove(args.ref)
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
    }
    results = []
    print("%-18s %10s %10s %10s %10s %8s %10s %5s" % ("case", "ucm ms", "ucmgo ms", "ucm cpu", "ucmgo cpu", "speedup", "copy ms", "diff"))
    for name in args.cases.split(","):
        r = cases[name]()
        results.append(r)
        print("%-18s %10.3f %10.3f %10.3f %10.3f %7.2fx %10.3f %5d" % (r["case"], r["ucm_wall_ms"], r["ucmgo_wall_ms"], r["ucm_cpu_ms"],
                                                                     r["ucmgo_cpu_ms"], r["speedup"], r["copy_floor_ms"], r["set_differences"]),
              flush=True)
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
