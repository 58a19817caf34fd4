#!/usr/bin/python3
"""Python-driven dump/load throughput through ucmgo (libucmgo.so) against the same pattern driven
from Go through connector.Store (no C ABI), from C through libucmgo.so (cdriver.c: the C ABI
without the interpreter) and against `ucm-lab bench` on the same shapes, in the same run: what
the C ABI and the Python package cost a connector.

    make lib build && /usr/bin/python3 connector/python/bench.py --dir ./ucm-data

Workloads mirror ucm-lab bench's: seq dumps --total bytes of whole blocks, --batch blocks per
task and --concurrency tasks in flight, closes and reopens the store, then loads them all;
layerwise dumps every block shard by shard (a task per shard of a batch) and loads shards in a
random order across batches. Buffers are page-aligned mmap memory (a connector's pinned host
buffers), addresses are passed as numpy tables built per call, as UCM's connector does. Every
loaded byte is compared after the timed phase. MB/s is 10^6 bytes per second.
"""

import argparse
import json
import mmap
import ctypes
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
os.environ.setdefault("UCMGO_LIB", str(REPO / "lib" / "libucmgo.so"))

from ucmgo import UcmGoStore  # noqa: E402


def size(s):
    units = {"k": 10, "kib": 10, "m": 20, "mib": 20, "g": 30, "gib": 30}
    s = s.strip().lower()
    for u, sh in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if s.endswith(u):
            return int(s[: -len(u)]) << sh
    return int(s)


class Slots:
    """window × batch aligned block buffers with a fixed random body; each shard's first 16
    bytes are stamped with (block, shard) before a dump, so every block's bytes are its own."""

    def __init__(self, count, block):
        self.block = block
        # Private and advised into huge pages, as ucm-lab bench's (--buffers huge) and the Go
        # driver's: mmap's default, MAP_SHARED, is shmem, which never gets them, and O_DIRECT
        # into 4 KiB pages pins 512 times as many pages per shard (loads ~25 % slower here).
        self.mm = mmap.mmap(-1, count * block, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self.mm.madvise(mmap.MADV_HUGEPAGE)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        self.mm[:] = os.urandom(count * block)
        self.count = count
        self.words = np.frombuffer(self.mm, dtype=np.uint64)  # for stamping (little-endian words)

    def stamp(self, first_slot, blocks, subs):
        """Stamps (block, sub-shard) into the first 16 bytes of every sub-shard of the slots
        from first_slot on holding blocks, in one vectorised step: Python's per-task work is
        what is measured, not a benchmark's own loop over every shard."""
        sub = self.block // subs
        slot = np.arange(len(blocks), dtype=np.int64)[:, None] + first_slot
        k = np.arange(subs, dtype=np.int64)[None, :]
        at = (slot * self.block + k * sub) // 8
        self.words[at] = np.asarray(blocks, dtype=np.uint64)[:, None]
        self.words[at + 1] = k.astype(np.uint64)

    def addr(self, slot, off=0):
        return self.base + slot * self.block + off


def stamp(b, s):
    return b.to_bytes(8, "little") + s.to_bytes(8, "little")


def block_id(b):
    return (b + 1).to_bytes(16, "little")


def expected_block(slots, slot, b, subs):
    """The bytes block b was dumped with from slot: the slot's body, each sub-shard stamped."""
    want = bytearray(slots.mm[slot * slots.block:(slot + 1) * slots.block])
    sub = slots.block // subs
    for k in range(subs):
        want[k * sub:k * sub + 16] = stamp(b, k)
    return want


def process_cpu():
    """The process's user plus system CPU seconds so far (every thread: Python's and Go's)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_python(args, workload, store_dir):
    shutil.rmtree(store_dir, ignore_errors=True)
    os.makedirs(store_dir)
    shards = args.shards if workload == "layerwise" else 1
    shard = args.block_size // shards
    half = shard // 2
    cfg = {"storage_backends": store_dir, "device_id": 0, "tensor_size_list": [half, half],
           "shard_size": shard, "block_size": args.block_size, "instance": "bench",
           "io_engine": args.io_engine, "sync_policy": "always"}
    cfg.update(extra_config(args))
    blocks = args.total // args.block_size
    groups = [list(range(g, min(blocks, g + args.batch))) for g in range(0, blocks, args.batch)]
    ring = args.concurrency  # batches in flight, as ucm-lab bench's workers
    slots = Slots(ring * args.batch, args.block_size)
    store = UcmGoStore(cfg)
    pending = [[] for _ in range(ring)]  # tasks still using each ring slot

    def free(r):
        for t in pending[r]:
            store.wait(t)
        pending[r] = []

    def tables(mem):
        """Every ring slot's address table, layer-first, built once as UCM's connector does
        (extract_block_addrs): [slot, shard, block, tensor], sliced per call."""
        t = np.empty((ring, shards, args.batch, 2), dtype=np.uint64)
        for r in range(ring):
            for s in range(shards):
                for j in range(args.batch):
                    t[r, s, j] = (mem.addr(r * args.batch + j, s * shard), mem.addr(r * args.batch + j, s * shard + half))
        return t

    src_tab = tables(slots)
    ids_of = [[block_id(b) for b in g] for g in groups]  # a request's ids, hashed once

    # Dump: each batch's every shard (one task each) from its ring slot.
    t0 = time.perf_counter()
    for gi, g in enumerate(groups):
        r = gi % ring
        free(r)
        slots.stamp(r * args.batch, g, args.shards)
        for s in range(shards):
            pending[r].append(store.dump_data(ids_of[gi], [s] * len(g), src_tab[r, s, :len(g)]))
    for r in range(ring):
        free(r)
    dump_s = time.perf_counter() - t0
    store.close()
    store = UcmGoStore(cfg)
    # Load every (batch, shard) unit, in random order for layerwise, `ring` units in flight.
    out = Slots(ring * args.batch, args.block_size)
    dst_tab = tables(out)
    units = [(gi, s) for gi in range(len(groups)) for s in range(shards)]
    if workload == "layerwise":
        random.Random(1).shuffle(units)
    cpu0, submitting = process_cpu(), 0.0
    t0 = time.perf_counter()
    for ui, (gi, s) in enumerate(units):
        r = ui % ring
        free(r)
        g = groups[gi]
        c0 = time.perf_counter()
        pending[r].append(store.load_data(ids_of[gi], [s] * len(g), dst_tab[r, s, :len(g)]))
        submitting += time.perf_counter() - c0
    for r in range(ring):
        free(r)
    load_s = time.perf_counter() - t0
    load_cpu = process_cpu() - cpu0
    # Verify every byte, outside the timing: load each batch again and compare.
    for gi, g in enumerate(groups):
        for s in range(shards):
            store.wait(store.load_data(ids_of[gi], [s] * len(g), dst_tab[0, s, :len(g)]))
        for j, b in enumerate(g):
            want = expected_block(slots, (gi % ring) * args.batch + j, b, args.shards)
            if out.mm[j * args.block_size:(j + 1) * args.block_size] != want:
                raise SystemExit("python %s: block %d differs" % (workload, b))
    st = store.stats()
    store.close()
    total = blocks * args.block_size
    return {"dump_mbps": total / dump_s / 1e6, "load_mbps": total / load_s / 1e6,
            "load_cpu_us": load_cpu * 1e6 / len(units), "load_submit_us": submitting * 1e6 / len(units),
            "io_engine": st["io_engine"],
            "direct": st["direct_io"], "blocks": blocks}


def extra_config(args):
    """--config-extra's members as a dict ("io_direct": false -> {"io_direct": False})."""
    return json.loads("{" + args.config_extra + "}") if args.config_extra else {}


def build_c_driver(tmp):
    """Compiles cdriver.c against lib/libucmgo.so (make lib)."""
    path = os.path.join(tmp, "cdriver")
    lib = os.path.dirname(os.environ["UCMGO_LIB"])
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-I" + str(REPO / "connector" / "capi"), "-o", path,
                    str(HERE / "cdriver.c"), "-L" + lib, "-lucmgo", "-Wl,-rpath," + lib], check=True)
    return path


def run_c(args, workload, driver, store_dir):
    shutil.rmtree(store_dir, ignore_errors=True)
    os.makedirs(store_dir)
    out = subprocess.run([driver, store_dir, workload, str(args.block_size), str(args.shards), str(args.total),
                          str(args.batch), str(args.concurrency), args.io_engine, args.config_extra],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def build_go_driver(tmp):
    """Builds connector's test binary, whose BenchmarkWindowDriver runs run_python's pattern from
    Go through connector.Store, without the C ABI."""
    path = os.path.join(tmp, "connector.test")
    subprocess.run(["go", "test", "-c", "-tags", "uring", "-ldflags=-checklinkname=0", "-o", path, "./connector"],
                   cwd=REPO, check=True)
    return path


def run_go(args, workload, driver, store_dir):
    env = dict(os.environ, UCMGO_BENCH_DIR=store_dir, UCMGO_BENCH_WORKLOAD=workload,
               UCMGO_BENCH_BLOCK=str(args.block_size), UCMGO_BENCH_SHARDS=str(args.shards),
               UCMGO_BENCH_TOTAL=str(args.total), UCMGO_BENCH_BATCH=str(args.batch),
               UCMGO_BENCH_WINDOW=str(args.concurrency), UCMGO_BENCH_IO_ENGINE=args.io_engine,
               UCMGO_BENCH_EXTRA=args.config_extra)
    out = subprocess.run([driver, "-test.run=XXX", "-test.bench=^BenchmarkWindowDriver$", "-test.benchtime=1x"],
                         env=env, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("BenchmarkWindowDriver"):
            f = line.split()
            return {"dump_mbps": float(f[f.index("dump-MB/s") - 1]), "load_mbps": float(f[f.index("load-MB/s") - 1]),
                    "load_cpu_us": float(f[f.index("load-cpu-µs/task") - 1]),
                    "load_submit_us": float(f[f.index("load-submit-µs/task") - 1])}
    raise SystemExit("go driver printed no result:\n" + out)


def run_tool(args, workload):
    if args.config_extra:
        return None  # ucm-lab bench takes no configuration members on its command line
    cmd = [str(REPO / "bin" / "ucm-lab"), "bench", "--dir", args.dir, "--workload", workload,
           "--block-size", str(args.block_size), "--shards", str(args.shards), "--total", str(args.total),
           "--batch", str(args.batch), "--concurrency", str(args.concurrency), "--io-engine", args.io_engine,
           "--buffers", "huge", "--json"]
    if workload == "layerwise":
        # Shards of --batch-block groups in random order, from a buffer per block, as here.
        cmd += ["--order", "random", "--host-layout", "block"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    return {"dump_mbps": r["dump_MBps"], "load_mbps": r["load_MBps"], "io_engine": r.get("io_engine"), "direct": r.get("direct")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="./ucm-data")
    ap.add_argument("--workload", default="seq,layerwise")
    ap.add_argument("--block-size", type=size, default=size("2MiB"))
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--total", type=size, default=size("2GiB"))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--io-engine", default="auto")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs of each; medians reported")
    ap.add_argument("--config-extra", default="", help='more members of the store configuration, JSON: \'"io_direct": false\'')
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    os.makedirs(args.dir, exist_ok=True)
    go_driver, c_driver = build_go_driver(args.dir), build_c_driver(args.dir)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    for workload in args.workload.split(","):
        runs = {"tool": [], "go": [], "c": [], "python": []}
        for _ in range(args.rounds):  # interleaved, so that the machine's drift hits all four
            runs["tool"].append(run_tool(args, workload))
            runs["go"].append(run_go(args, workload, go_driver, os.path.join(args.dir, "bench-go-" + workload)))
            runs["c"].append(run_c(args, workload, c_driver, os.path.join(args.dir, "bench-c-" + workload)))
            runs["python"].append(run_python(args, workload, os.path.join(args.dir, "bench-python-" + workload)))
        py = runs["python"]
        row = {"workload": workload, "io_engine": py[0]["io_engine"], "direct": py[0]["direct"], "rounds": args.rounds}
        for k in ("dump_mbps", "load_mbps", "load_cpu_us", "load_submit_us"):
            for who, xs in runs.items():
                if xs[0] is not None and k in xs[0]:
                    row[who + "_" + k] = med([x[k] for x in xs])
        for k in ("dump_mbps", "load_mbps"):
            # Per-round ratios against the Go driver (each set ran back to back), median.
            for who in ("python", "c", "tool"):
                if runs[who][0] is not None:
                    row["%s_vs_go_%s" % (who, k[:4])] = med([x[k] / g[k] for x, g in zip(runs[who], runs["go"])])
        rows.append(row)
    if args.json:
        print(json.dumps(rows))
        return
    cell = lambda r, k, f: (f % r[k]) if k in r else "-"  # noqa: E731
    print("%-10s %-5s %9s %9s %9s %9s %9s %9s %9s" % ("workload", "", "go MB/s", "c MB/s", "py MB/s", "tool MB/s",
                                                      "c/go", "py/go", "tool/go"))
    for r in rows:
        for k in ("dump", "load"):
            print("%-10s %-5s %9s %9s %9s %9s %9s %9s %9s" % (
                r["workload"], k, cell(r, "go_%s_mbps" % k, "%.0f"), cell(r, "c_%s_mbps" % k, "%.0f"),
                cell(r, "python_%s_mbps" % k, "%.0f"), cell(r, "tool_%s_mbps" % k, "%.0f"),
                cell(r, "c_vs_go_" + k, "%.3f"), cell(r, "python_vs_go_" + k, "%.3f"), cell(r, "tool_vs_go_" + k, "%.3f")))
        print("%-10s %-5s %9s %9s %9s   (process CPU per load task, µs)" % (
            r["workload"], "cpu", cell(r, "go_load_cpu_us", "%.0f"), cell(r, "c_load_cpu_us", "%.0f"),
            cell(r, "python_load_cpu_us", "%.0f")))
        print("%-10s %-5s %9s %9s %9s   (time in the load call per task, µs)" % (
            r["workload"], "call", cell(r, "go_load_submit_us", "%.1f"), cell(r, "c_load_submit_us", "%.1f"),
            cell(r, "python_load_submit_us", "%.1f")))
    print("(%s, O_DIRECT %s, %d rounds interleaved, medians; block %d B, %d shards, batch %d, window/concurrency %d%s)" % (
        rows[0]["io_engine"], rows[0]["direct"], args.rounds, args.block_size, args.shards, args.batch, args.concurrency,
        ", " + args.config_extra if args.config_extra else ""))
    print("go: connector.Store without the C ABI; c: cdriver.c through libucmgo.so; py: ucmgo through libucmgo.so;")
    print("each one thread keeping `window` tasks in flight (UCM's connector). tool: ucm-lab bench, `concurrency` goroutines.")


if __name__ == "__main__":
    main()
